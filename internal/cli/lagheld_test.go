package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/testenv"
)

// TestLagShowsHeldRecords: a producer (not Meterline's) left a
// transaction open on partition 0 of a topic a group reads, and another
// producer's committed transaction followed it. The group has read
// everything up to the last stable offset, so it is not behind, but
// `meterline lag` shows partition 0 even without --all, with the five
// records past that offset (the open transaction's record, the three
// committed ones and their marker) in its RECORDS HELD column, and a note
// under the table names the runbook. Partition 1, which holds nothing, is
// shown with --all only, holding 0; nothing held, no note.
func TestLagShowsHeldRecords(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		testLagShowsHeld(t, brokers)
	})
	t.Run("real-kafka", func(t *testing.T) {
		testLagShowsHeld(t, testenv.RealKafka(t))
	})
}

func testLagShowsHeld(t *testing.T, brokers []string) {
	ctx := context.Background()
	topic, group := testenv.Name(t, "held"), testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 2, nil)
	open := testenv.HoldPartition(t, brokers, topic, 0, group+"-open")
	adm := testenv.Admin(t, brokers)
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 0, -1)
	offs.AddOffset(topic, 1, 0, -1)
	if _, err := adm.CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}

	// held returns the RECORDS HELD column of each partition of topic
	// stdout shows.
	held := func(stdout string) map[string]string {
		out := map[string]string{}
		for _, l := range strings.Split(stdout, "\n") {
			if f := strings.Fields(l); len(f) == 8 && f[1] == topic {
				out[f[2]] = f[7]
			}
		}
		return out
	}
	const note = "see docs/operations.md, MeterlineInputHeldByOpenTransaction"
	for _, all := range []bool{false, true} {
		args := []string{"lag", "--brokers", strings.Join(brokers, ","), "--group", group}
		want := map[string]string{"0": "5"}
		if all {
			args = append(args, "--all")
			want["1"] = "0"
		}
		code, stdout, stderr := run(t, "", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
		}
		if !strings.Contains(stdout, "RECORDS HELD") {
			t.Errorf("%v: no RECORDS HELD column:\n%s", args, stdout)
		}
		if got := held(stdout); len(got) != len(want) || got["0"] != want["0"] || got["1"] != want["1"] {
			t.Errorf("%v: records held per partition %v, want %v:\n%s", args, got, want, stdout)
		}
		if !strings.Contains(stdout, "0 behind, 0 records behind") {
			t.Errorf("%v: stdout %q; want nothing behind", args, stdout)
		}
		if !strings.Contains(stdout, "note: 1 partition holds 5 records past its last stable offset") || !strings.Contains(stdout, note) {
			t.Errorf("%v: no note of the held partition and its runbook:\n%s", args, stdout)
		}
		checkLagJSON(t, args, stdout, 1, 5)
	}

	if err := open.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	// The abort marker, offset 5, which a broker writes once
	// EndTransaction has returned: the last stable offset is then 6.
	testenv.WaitPartitionEnd(t, adm.ListCommittedOffsets, topic, 0, 6)
	code, stdout, stderr := run(t, "", "lag", "--brokers", strings.Join(brokers, ","), "--group", group, "--all")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if got := held(stdout); got["0"] != "0" || got["1"] != "0" {
		t.Errorf("after the abort: records held per partition %v, want 0 and 0:\n%s", got, stdout)
	}
	if strings.Contains(stdout, "note:") {
		t.Errorf("after the abort, nothing is held, yet:\n%s", stdout)
	}
	checkLagJSON(t, []string{"lag", "--brokers", strings.Join(brokers, ","), "--group", group, "--all"}, stdout, 0, 0)
}

// checkLagJSON runs `meterline lag` with args and -o json, and checks
// that its partitions and totals are the table's (stdout, from the same
// args): the same rows, committed offsets, ends, records behind and held,
// and the same totals, holding partitions of them holding held records.
// The JSON also has each partition's high watermark: end plus held.
func checkLagJSON(t *testing.T, args []string, table string, holding, held int64) {
	t.Helper()
	args = append(slices.Clone(args), "-o", "json")
	code, stdout, stderr := run(t, "", args...)
	if code != 0 {
		t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
	}
	var doc struct {
		Time       time.Time `json:"time"`
		Partitions []struct {
			Group         string   `json:"group"`
			Topic         string   `json:"topic"`
			Partition     int32    `json:"partition"`
			Committed     *int64   `json:"committed_offset"`
			End           int64    `json:"end_offset"`
			High          int64    `json:"high_watermark"`
			RecordsBehind int64    `json:"records_behind"`
			SecondsBehind *float64 `json:"seconds_behind"`
			RecordsHeld   int64    `json:"records_held"`
		} `json:"partitions"`
		Totals struct {
			Partitions        *int   `json:"partitions"`
			PartitionsBehind  *int   `json:"partitions_behind"`
			RecordsBehind     *int64 `json:"records_behind"`
			PartitionsHolding *int   `json:"partitions_holding"`
			RecordsHeld       *int64 `json:"records_held"`
		} `json:"totals"`
		GroupsWithoutOffsets []string `json:"groups_without_offsets"`
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%v: stdout is not the JSON document: %v\n%s", args, err, stdout)
	}
	if doc.Time.IsZero() {
		t.Errorf("%v: no time:\n%s", args, stdout)
	}
	// The table's rows, spaces squeezed, with the seconds behind apart:
	// a partition behind ages between the two commands.
	var want []string
	var wantSecs []float64
	for _, l := range strings.Split(table, "\n")[1:] {
		f := strings.Fields(l)
		if len(f) != 8 {
			break
		}
		secs, err := strconv.ParseFloat(f[6], 64)
		if err != nil {
			t.Fatalf("table row %q: %v", l, err)
		}
		want = append(want, strings.Join(slices.Delete(f, 6, 7), " "))
		wantSecs = append(wantSecs, secs)
	}
	var rows []string
	for i, p := range doc.Partitions {
		committed := "-"
		if p.Committed != nil {
			committed = fmt.Sprint(*p.Committed)
		}
		if p.SecondsBehind == nil {
			t.Fatalf("%v: partition %d has no seconds_behind:\n%s", args, p.Partition, stdout)
		}
		if p.High != p.End+p.RecordsHeld {
			t.Errorf("%v: partition %d: high watermark %d, end %d, %d held", args, p.Partition, p.High, p.End, p.RecordsHeld)
		}
		if i < len(wantSecs) && (*p.SecondsBehind < wantSecs[i]-0.05 || *p.SecondsBehind > wantSecs[i]+30) {
			t.Errorf("%v: partition %d: %.3f seconds behind; the table, a moment before, said %.1f", args, p.Partition, *p.SecondsBehind, wantSecs[i])
		}
		rows = append(rows, fmt.Sprintf("%s %s %d %s %d %d %d", p.Group, p.Topic, p.Partition, committed, p.End, p.RecordsBehind, p.RecordsHeld))
	}
	if !slices.Equal(rows, want) {
		t.Errorf("%v: partitions\n%s\nwant the table's\n%s", args, strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	tt := doc.Totals
	if tt.Partitions == nil || tt.PartitionsBehind == nil || tt.RecordsBehind == nil || tt.PartitionsHolding == nil || tt.RecordsHeld == nil {
		t.Fatalf("%v: totals incomplete:\n%s", args, stdout)
	}
	if total := fmt.Sprintf("%d partitions, %d behind, %d records behind in total", *tt.Partitions, *tt.PartitionsBehind, *tt.RecordsBehind); !strings.Contains(table, total) {
		t.Errorf("%v: totals %q, not the table's:\n%s", args, total, table)
	}
	if *tt.PartitionsHolding != int(holding) || *tt.RecordsHeld != held {
		t.Errorf("%v: %d partitions holding %d records; want %d holding %d:\n%s", args, *tt.PartitionsHolding, *tt.RecordsHeld, holding, held, stdout)
	}
}

// TestPrintLagHeldNote: the note under the table counts the partitions
// holding records past their last stable offset, and their records.
func TestPrintLagHeldNote(t *testing.T) {
	rows := []lag.Row{
		{Group: "g", Topic: "t", Partition: 0, Committed: 7, End: 7, High: 10},
		{Group: "g", Topic: "t", Partition: 1, Committed: 3, End: 5, High: 5, Records: 2, Behind: 1500 * time.Millisecond},
		{Group: "g", Topic: "u", Partition: 0, Committed: -1, End: 4, High: 6, Records: 4, Behind: time.Second},
	}
	var b strings.Builder
	printLag(&b, newLagReport(rows, false, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var got []string
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"GROUP TOPIC PARTITION COMMITTED END RECORDS BEHIND SECONDS BEHIND RECORDS HELD",
		"g t 0 7 7 0 0.0 3",
		"g t 1 3 5 2 1.5 0",
		"g u 0 - 4 4 1.0 2",
		"3 partitions, 2 behind, 6 records behind in total (2026-01-02T03:04:05Z)",
		"note: 2 partitions hold 5 records past their last stable offsets: a transaction open there stops the group's reads " +
			"while its lag reads 0 (see docs/operations.md, MeterlineInputHeldByOpenTransaction)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("printLag:\n%s\nwant (spaces squeezed):\n%s", b.String(), strings.Join(want, "\n"))
	}
}

// TestPrintLagJSON: `meterline lag -o json` writes the table's facts
// under stable snake_case names, which scripts read: a partition without
// a committed offset has committed_offset null, the totals count every
// partition (those not shown without --all too), and the groups asked for
// without a row are listed.
func TestPrintLagJSON(t *testing.T) {
	rows := []lag.Row{
		{Group: "g", Topic: "t", Partition: 0, Committed: 7, End: 7, High: 10},
		{Group: "g", Topic: "t", Partition: 1, Committed: 3, End: 5, High: 5, Records: 2, Behind: 1500 * time.Millisecond},
		{Group: "g", Topic: "t", Partition: 2, Committed: 9, End: 9, High: 9},
		{Group: "g", Topic: "u", Partition: 0, Committed: -1, End: 4, High: 6, Records: 4, Behind: time.Second},
	}
	r := newLagReport(rows, false, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	r.GroupsWithoutOffsets = groupsWithoutRows([]string{"g", "h"}, rows)
	var b strings.Builder
	if err := printLagJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	want := `{
  "time": "2026-01-02T03:04:05Z",
  "partitions": [
    {
      "group": "g",
      "topic": "t",
      "partition": 0,
      "committed_offset": 7,
      "end_offset": 7,
      "high_watermark": 10,
      "records_behind": 0,
      "seconds_behind": 0,
      "records_held": 3
    },
    {
      "group": "g",
      "topic": "t",
      "partition": 1,
      "committed_offset": 3,
      "end_offset": 5,
      "high_watermark": 5,
      "records_behind": 2,
      "seconds_behind": 1.5,
      "records_held": 0
    },
    {
      "group": "g",
      "topic": "u",
      "partition": 0,
      "committed_offset": null,
      "end_offset": 4,
      "high_watermark": 6,
      "records_behind": 4,
      "seconds_behind": 1,
      "records_held": 2
    }
  ],
  "totals": {
    "partitions": 4,
    "partitions_behind": 2,
    "records_behind": 6,
    "partitions_holding": 2,
    "records_held": 5
  },
  "groups_without_offsets": [
    "h"
  ]
}
`
	if b.String() != want {
		t.Errorf("printLagJSON:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestPrintLagHeldNoteCountsPartitionsOnce: records held past a
// partition's last stable offset are the partition's, whatever reads it:
// with the default groups the aggregator and the sink both read
// usage.deduped.v2, and the note (and the JSON totals) count such a
// partition, and its records, once, not once a group.
func TestPrintLagHeldNoteCountsPartitionsOnce(t *testing.T) {
	rows := []lag.Row{
		{Group: "agg", Topic: "d", Partition: 0, Committed: 7, End: 7, High: 12},
		{Group: "sink", Topic: "d", Partition: 0, Committed: 7, End: 7, High: 12},
		{Group: "sink", Topic: "e", Partition: 0, Committed: 2, End: 2, High: 2},
	}
	r := newLagReport(rows, false, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if r.Totals.PartitionsHolding != 1 || r.Totals.RecordsHeld != 5 {
		t.Errorf("totals: %d partitions holding %d records; want 1 holding 5", r.Totals.PartitionsHolding, r.Totals.RecordsHeld)
	}
	var b strings.Builder
	printLag(&b, r)
	if !strings.Contains(b.String(), "note: 1 partition holds 5 records past its last stable offset") {
		t.Errorf("printLag:\n%s\nwant the note of 1 partition holding 5 records", b.String())
	}
	if len(r.Partitions) != 2 || r.Partitions[0].RecordsHeld != 5 || r.Partitions[1].RecordsHeld != 5 {
		t.Errorf("rows %+v: want each group's row with the 5 records held", r.Partitions)
	}
}
