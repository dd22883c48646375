package stream

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
)

// TestStandbyDatesByAnEarlierListing: a standby tail dates its copy by
// any listing of the changelog's end it has read up to, not only the
// latest. Here the end is listed while transaction X1 is open, and again
// once X2, of another producer (a fenced owner's and the new one's), is
// open too; X1 commits first: the copy reads up to the first listed end
// (X1's records, below X2's) and takes that listing's date, but is not
// counted as keeping up until it reaches the latest listing. When it
// waited for the latest listed end only, a standby whose reads trail the
// owner's commits by more than the listing interval (a long
// --commit-interval, transactions larger than it reads in a second) took
// no date for as long as the owner wrote: it started over from the
// changelog's start once its first date fell out of the restore horizon,
// and stopped copying after three such copies.
func TestStandbyDatesByAnEarlierListing(t *testing.T) {
	t.Parallel()
	datesByEarlierListing(t, newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("3600000")}))
}

// TestRealStandbyDatesByAnEarlierListing is
// TestStandbyDatesByAnEarlierListing on the real broker of
// METERLINE_TEST_KAFKA: its last stable offset and transaction markers.
func TestRealStandbyDatesByAnEarlierListing(t *testing.T) {
	brokers := testenv.RealKafka(t)
	w := &kvWorld{t: t, brokers: brokers, input: testenv.Name(t, "in"), changelog: testenv.Name(t, "changelog"), group: testenv.Name(t, "group")}
	testenv.CreateTopic(t, brokers, w.input, 1, nil)
	testenv.CreateTopic(t, brokers, w.changelog, 1, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("3600000")})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	w.cl = cl
	datesByEarlierListing(t, w)
}

func datesByEarlierListing(t *testing.T, w *kvWorld) {
	rt, _ := w.standbyRuntime(&skewClock{}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), prometheus.NewRegistry())
	// The test gives the tail its listings.
	rt.sb.ends.interval = time.Hour
	ctx := context.Background()
	producer := func(id string) *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(w.brokers...), kgo.DefaultProduceTopic(w.changelog), kgo.TransactionalID(w.changelog+"-"+id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	p1, p2 := producer("1"), producer("2")
	rt.sb.mu.Lock()
	rt.sb.start(0)
	tl := rt.sb.tails[0]
	rt.sb.mu.Unlock()
	var sub *endSub
	waitUntil(t, "the tail to subscribe to the listings", func() bool {
		rt.sb.ends.mu.Lock()
		defer rt.sb.ends.mu.Unlock()
		for s := range rt.sb.ends.subs {
			sub = s
		}
		return sub != nil
	})
	list := func() listedEnd {
		at := rt.cfg.Clock.Now()
		return listedEnd{end: w.changelogEnd(), at: at}
	}
	give := func(l listedEnd) {
		sub.give(l)
		waitUntil(t, "the tail to take the listing", func() bool { return len(sub.got) == 0 })
	}
	begin := func(cl *kgo.Client, kv ...string) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, kvRecords(kv...)...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(cl *kgo.Client) {
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	read := func(what string, end int64) {
		waitUntil(t, what, func() bool {
			var off int64 = -1
			rt.EachStandbyStatus(func(_ int32, o, _ int64) { off = o })
			return off >= end
		})
	}
	dated := func() time.Time {
		cp, ok, err := rt.store.Checkpoint(0)
		if err != nil || !ok {
			t.Fatalf("no checkpoint (%v)", err)
		}
		return cp.At
	}

	begin(p1, "a", "1", "b", "2")
	l1 := list()
	give(l1)
	begin(p2, "c", "3")
	l2 := list()
	give(l2)
	commit(p1)
	read("the tail to read X1", l1.end)
	if at := dated(); at.UnixMilli() < l1.at.UnixMilli() {
		t.Fatalf("the copy is dated %s, before the end %d listed at %s it has read up to",
			at.Format(time.RFC3339Nano), l1.end, l1.at.Format(time.RFC3339Nano))
	}
	// Dated by an older listing only, the copy may be falling behind: it
	// is not known to keep up (its copies in a row that outlast the
	// horizon go on counting) until it reaches the latest listing.
	if tl.dated.Load() {
		t.Fatal("the copy counts as keeping up before it read up to the latest listing")
	}
	commit(p2)
	read("the tail to read X2", l2.end)
	waitUntil(t, "the copy to keep up once it read up to the latest listing", tl.dated.Load)
	if at := dated(); at.UnixMilli() < l2.at.UnixMilli() {
		t.Fatalf("the copy is dated %s, before the latest listing it read up to, at %s", at.Format(time.RFC3339Nano), l2.at.Format(time.RFC3339Nano))
	}
}

// waitUntil waits up to 15 s for cond.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15 s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestListedTargets: a tail's listings are reached in order, the latest
// one reached dates the copy, and a copy far behind keeps listings spread
// over its catch-up, the oldest and the latest among them.
func TestListedTargets(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var ts listedTargets
	for i := range 200 {
		ts.add(listedEnd{end: int64(10 * i), at: t0.Add(time.Duration(i) * time.Second)})
	}
	if n := len(ts.ls); n > maxListedTargets {
		t.Fatalf("%d listings kept, want at most %d", n, maxListedTargets)
	}
	if first, last := ts.ls[0], ts.ls[len(ts.ls)-1]; first.end != 0 || last.end != 1990 {
		t.Fatalf("kept listings from end %d to %d, want 0 to 1990", first.end, last.end)
	}
	l, ok := ts.reached(5)
	if !ok || l.end != 0 {
		t.Fatalf("reached(5) = %+v, %v; want the listing of end 0", l, ok)
	}
	if _, ok := ts.reached(5); ok {
		t.Fatal("a listing reached twice")
	}
	l, ok = ts.reached(1000)
	if !ok || l.end > 1000 || l.end < 900 {
		t.Fatalf("reached(1000) = %+v, %v; want a listing of an end in [900, 1000]", l, ok)
	}
	l, ok = ts.reached(5000)
	if !ok || l.end != 1990 || len(ts.ls) != 0 {
		t.Fatalf("reached(5000) = %+v, %v, %d left; want the latest listing, none left", l, ok, len(ts.ls))
	}
}
