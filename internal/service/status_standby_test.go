package service

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// standbyStage is a fakeStage that keeps standby replicas (StandbyStage).
type standbyStage struct {
	fakeStage
	standbys  [][3]int64 // partition, offset, lag
	placement [3]int     // asked, placed, members (StandbyPlacementStage)
}

func (s *standbyStage) StandbyPlacement() (asked, placed, members int) {
	return s.placement[0], s.placement[1], s.placement[2]
}

func (s *standbyStage) EachStandbyStatus(fn func(p int32, offset, lag int64)) {
	for _, sb := range s.standbys {
		fn(int32(sb[0]), sb[1], sb[2])
	}
}

// TestStatusPageStandbys: the partitions a stage keeps warm as a standby
// are on the page and in status.json, with their checkpoint offset and how
// far behind they are ("n/a" while not known).
func TestStatusPageStandbys(t *testing.T) {
	reg := prometheus.NewRegistry()
	newFakeStages(reg, false)
	s, _ := newTestServer(t, reg)
	st := &standbyStage{fakeStage: fakeStage{stage: "dedup", group: "g", instance: "n1", input: "usage.events", joined: true,
		parts: []fakePartition{{p: 0, remaining: -1}}},
		standbys: [][3]int64{{1, 5000, 12}, {3, -1, -1}}}
	s.AddStatus(func() StageStatus { return StageStatusOf(st) })
	v := page(t, s)
	for k, want := range map[string]string{
		"standby/dedup/1/offset": "5000", "standby/dedup/1/lag": "12",
		"standby/dedup/3/offset": "n/a", "standby/dedup/3/lag": "n/a",
	} {
		if v[k] != want {
			t.Errorf("%s = %q, want %q", k, v[k], want)
		}
	}
	got := StageStatusOf(st).Standbys
	if len(got) != 2 || *got[0].Offset != 5000 || *got[0].LagRecords != 12 || got[1].Offset != nil {
		t.Fatalf("standbys %+v", got)
	}
}

// TestStatusPageStandbyPlacement: a stage that gets fewer standby copies
// per partition than it asks for says so on the page and in status.json;
// one that asks for none, or whose placement is not known yet, shows none.
func TestStatusPageStandbyPlacement(t *testing.T) {
	reg := prometheus.NewRegistry()
	newFakeStages(reg, false)
	s, _ := newTestServer(t, reg)
	st := &standbyStage{fakeStage: fakeStage{stage: "aggregate", group: "g", instance: "n1", input: "usage.deduped", joined: true,
		parts: []fakePartition{{p: 0, remaining: -1}}}, placement: [3]int{2, 1, 2}}
	s.AddStatus(func() StageStatus { return StageStatusOf(st) })
	if got := page(t, s)["standby_replicas/aggregate"]; got != "1 of 2 asked" {
		t.Errorf("standby_replicas/aggregate = %q, want %q", got, "1 of 2 asked")
	}
	if got := StageStatusOf(st).StandbyReplicas; got == nil || *got != (StandbyPlacement{Asked: 2, Placed: 1, Members: 2}) || !got.Short() {
		t.Fatalf("standby replicas %+v", got)
	}
	for _, pl := range [][3]int{{0, 0, 2}, {1, -1, 0}} {
		st.placement = pl
		if got := StageStatusOf(st).StandbyReplicas; got != nil {
			t.Errorf("placement %v: standby replicas %+v, want none", pl, got)
		}
	}
}
