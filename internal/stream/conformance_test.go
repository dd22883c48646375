package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// The runtime's conformance suite: one processor that counts, one world
// (an input, an output and a changelog topic on kfake, and a model of
// every input sent), and the crash windows that the runtime owns
// (docs/design.md, Exactly-once, "Crash windows"), each a named case that
// drives instances through the window and then checks that every input was
// counted exactly once — in the committed outputs, in the changelog and in
// the local state of the last owner.
//
// The Processor contract it relies on (txn.go): Process sees each input
// record in exactly one committed transaction; state written through Tx is
// read back by later transactions only if its own committed; Flush runs
// before each commit of a transaction the partition took part in; Abort
// runs when such a transaction is aborted or discarded.
//
// The cases run in parallel on their own kfake clusters, with in-process
// crashes (Runtime.CrashAt) and kfake's request controls for what a
// broker or a paused process would do; the whole package takes about 10 s
// of test time on two busy cores.

// countProc counts inputs per bucket. An input record's key is its bucket,
// its value its id; an id starting with "!" resets the bucket (a changelog
// tombstone). For each input it emits one output record, key the id, value
// "bucket=count" (count 0 after a reset), and in Flush one record with key
// "txn" listing the ids the transaction counted on the partition.
//
// Like the aggregator, it keeps memory besides the store: a cache of the
// bucket counts, ahead of the committed state while a transaction is open,
// which Abort must drop (Aborter).
type countProc struct {
	output string
	// hold, when set, is called before an input is counted and may block
	// (a stalled instance).
	hold func(id string)
	// poison makes Process return errPoison for this id.
	poison string
}

var errPoison = errors.New("poisoned input")

func (c *countProc) Open(p int32, _ *PartitionState) (Partition, error) {
	return &countPart{proc: c, p: p, cache: map[string]int64{}}, nil
}

type countPart struct {
	proc    *countProc
	p       int32
	cache   map[string]int64 // bucket counts read or written; absent: read the store
	pending []string         // ids counted in the open transaction
}

func (c *countPart) Process(tx *Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		id, bucket := string(r.Value), string(r.Key)
		if c.proc.hold != nil {
			c.proc.hold(id)
		}
		if id == c.proc.poison {
			return errPoison
		}
		n, cached := c.cache[bucket]
		if !cached {
			v, ok, err := tx.Get(r.Key)
			if err != nil {
				return err
			}
			if ok {
				if n, err = strconv.ParseInt(string(v), 10, 64); err != nil {
					return fmt.Errorf("bucket %s: %w", bucket, err)
				}
			}
		}
		if reset := strings.HasPrefix(id, "!"); reset {
			n = 0
			tx.Delete(r.Key)
		} else {
			n++
			tx.Put(r.Key, []byte(strconv.FormatInt(n, 10)))
		}
		c.cache[bucket] = n
		tx.Emit(&kgo.Record{Topic: c.proc.output, Partition: c.p, Key: []byte(id), Value: fmt.Appendf(nil, "%s=%d", bucket, n)})
		c.pending = append(c.pending, id)
	}
	return nil
}

func (c *countPart) Flush(tx *Tx) error {
	if len(c.pending) > 0 {
		tx.Emit(&kgo.Record{Topic: c.proc.output, Partition: c.p, Key: []byte("txn"), Value: []byte(strings.Join(c.pending, ","))})
	}
	c.pending = nil
	return nil
}

// Abort forgets the transaction: its ids, and counts the store may not
// hold.
func (c *countPart) Abort() {
	c.pending = nil
	clear(c.cache)
}

func (*countPart) Punctuate(*Tx) error { return nil }
func (*countPart) Close()              {}

// input is one record the suite sent.
type input struct {
	id, bucket string
	extra      bool // sent to the suite's extra topic
}

// suite is one world of the conformance suite.
type suite struct {
	t                               *testing.T
	cluster                         *kfake.Cluster // nil on a real broker
	brokers                         []string
	input, output, changelog, group string
	// extra, when not empty, is a second input topic co-partitioned with
	// input (Config.CopartitionedTopics): send spreads inputs over both,
	// its buckets named "x…" so that each bucket is counted from one topic.
	extra    string
	parts    int32
	producer *kgo.Client
	adm      *kadm.Client
	mu       sync.Mutex
	sent     [][]input // per input partition, in offset order
	next     int
	running  []*instance // every instance started
}

// newSuite makes a world with two input partitions on its own kfake
// cluster, or on the real broker brokers when not nil (cluster is then
// nil). changelogConfigs may be nil. With twoTopics, a second input topic
// is co-partitioned with the first (suite.extra).
func newSuite(t *testing.T, brokers []string, changelogConfigs map[string]*string, twoTopics ...bool) *suite {
	var cluster *kfake.Cluster
	if brokers == nil {
		cluster, brokers = testenv.KFake(t, kfake.GroupMinSessionTimeout(500*time.Millisecond))
	}
	return newSuiteOn(t, cluster, brokers, changelogConfigs, twoTopics...)
}

// newSuiteOn is newSuite on cluster (nil: the real broker brokers).
func newSuiteOn(t *testing.T, cluster *kfake.Cluster, brokers []string, changelogConfigs map[string]*string, twoTopics ...bool) *suite {
	s := &suite{t: t, cluster: cluster, brokers: brokers, parts: 2,
		input: testenv.Name(t, "in"), output: testenv.Name(t, "out"), changelog: testenv.Name(t, "changelog"),
		group: testenv.Name(t, "group")}
	testenv.CreateTopic(t, brokers, s.input, s.parts, nil)
	if len(twoTopics) > 0 && twoTopics[0] {
		s.extra = testenv.Name(t, "in2")
		testenv.CreateTopic(t, brokers, s.extra, s.parts, nil)
	}
	testenv.CreateTopic(t, brokers, s.output, s.parts, nil)
	testenv.CreateTopic(t, brokers, s.changelog, s.parts, changelogConfigs)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	s.producer, s.adm = cl, kadm.NewClient(cl)
	s.sent = make([][]input, s.parts)
	return s
}

// send produces n new inputs, spread over the partitions and three buckets
// (and over both input topics, with an extra one: every third input goes to
// it).
func (s *suite) send(n int) {
	s.t.Helper()
	var recs []*kgo.Record
	s.mu.Lock()
	for range n {
		i := s.next
		s.next++
		p := int32(i) % s.parts
		in := input{id: fmt.Sprintf("i%04d", i), bucket: fmt.Sprintf("b%d", (i/int(s.parts))%3)}
		topic := s.input
		if s.extra != "" && i%3 == 2 {
			in.extra, in.bucket, topic = true, "x"+in.bucket, s.extra
		}
		s.sent[p] = append(s.sent[p], in)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(in.bucket), Value: []byte(in.id)})
	}
	s.mu.Unlock()
	s.produce(recs...)
}

// sendTo produces one input to a given partition and bucket; an id
// starting with "!" resets the bucket.
func (s *suite) sendTo(p int32, bucket, id string) {
	s.t.Helper()
	s.mu.Lock()
	s.sent[p] = append(s.sent[p], input{id: id, bucket: bucket})
	s.mu.Unlock()
	s.produce(&kgo.Record{Topic: s.input, Partition: p, Key: []byte(bucket), Value: []byte(id)})
}

func (s *suite) produce(recs ...*kgo.Record) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		s.t.Fatal(err)
	}
}

// caughtUp waits until the group has committed every input sent, of
// every input topic.
func (s *suite) caughtUp() {
	s.t.Helper()
	var err error
	s.waitFor("the group to commit every input", func() bool {
		for _, topic := range append([]string{s.input}, s.extraTopics()...) {
			var ok bool
			if ok, err = testenv.CaughtUp(s.brokers, s.group, topic); err != nil || !ok {
				return false
			}
		}
		return true
	})
}

// waitFor polls cond until it holds. It fails the test after 30 s, or as
// soon as an instance stops that was not asked to (its Run error says why).
func (s *suite) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		s.mu.Lock()
		running := slices.Clone(s.running)
		s.mu.Unlock()
		for _, in := range running {
			select {
			case <-in.done:
				if !in.exitExpected.Load() {
					s.t.Fatalf("waiting for %s: instance %s stopped: %v", what, in.id, in.err)
				}
			default:
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after 30 s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// instance is one running Runtime of the suite.
type instance struct {
	t    *testing.T
	id   string
	rt   *Runtime
	reg  *prometheus.Registry
	proc *countProc
	stop context.CancelFunc
	done chan struct{} // closed when Run returned; err is then set
	err  error
	// exitExpected is set once the test stops the instance or waits for
	// it to stop by itself.
	exitExpected atomic.Bool
}

// config is an instance's configuration: fast timers for kfake.
func (s *suite) config(id string, fs vfs.FS) Config {
	return Config{Stage: "count",
		Config: session.Config{Kafka: kafka.Config{Brokers: s.brokers}, Group: s.group, InstanceID: id,
			SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second, RestartBackoff: 50 * time.Millisecond},
		InputTopic: s.input, CopartitionedTopics: s.extraTopics(), ChangelogTopic: s.changelog, FS: fs, StateDir: "state-" + id,
		CommitInterval: 20 * time.Millisecond,
		Logger:         zaptest.NewLogger(s.t, zaptest.Level(zap.InfoLevel)).Named(id)}
}

// extraTopics is Config.CopartitionedTopics: the extra topic, if any.
func (s *suite) extraTopics() []string {
	if s.extra == "" {
		return nil
	}
	return []string{s.extra}
}

// sentTo counts the inputs sent to partition p of the input topic (extra
// false) or of the extra topic.
func (s *suite) sentTo(p int32, extra bool) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, in := range s.sent[p] {
		if in.extra == extra {
			n++
		}
	}
	return n
}

// start runs an instance with id and its state on fs; mod may change its
// config and processor before it starts.
func (s *suite) start(id string, fs vfs.FS, mod ...func(*Config, *countProc)) *instance {
	s.t.Helper()
	proc := &countProc{output: s.output}
	return s.startProc(id, fs, proc, func(cfg *Config) {
		for _, m := range mod {
			m(cfg, proc)
		}
	})
}

// startProc is start with any processor; mod changes the config before it
// starts. The instance's proc is set when the processor is a *countProc.
func (s *suite) startProc(id string, fs vfs.FS, proc Processor, mod func(*Config)) *instance {
	s.t.Helper()
	return s.startRuntime(id, fs, proc, mod, nil)
}

// startRuntime is startProc with a hook that, when not nil, may change the
// runtime before it runs.
func (s *suite) startRuntime(id string, fs vfs.FS, proc Processor, mod func(*Config), hook func(*Runtime)) *instance {
	s.t.Helper()
	cfg := s.config(id, fs)
	mod(&cfg)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	rt, err := New(cfg, proc)
	if err != nil {
		s.t.Fatal(err)
	}
	if hook != nil {
		hook(rt)
	}
	ctx, stop := context.WithCancel(context.Background())
	in := &instance{t: s.t, id: id, rt: rt, reg: reg, stop: stop, done: make(chan struct{})}
	in.proc, _ = proc.(*countProc)
	go func() {
		defer close(in.done)
		in.err = rt.Run(ctx)
	}()
	s.t.Cleanup(func() {
		in.exitExpected.Store(true)
		stop()
		<-in.done
	})
	s.mu.Lock()
	s.running = append(s.running, in)
	s.mu.Unlock()
	return in
}

// exit waits until Run returns by itself (a crash, a fatal error) and
// returns its error.
func (in *instance) exit() error {
	in.t.Helper()
	in.exitExpected.Store(true)
	select {
	case <-in.done:
		return in.err
	case <-time.After(30 * time.Second):
		in.t.Fatalf("instance %s did not stop by itself within 30 s", in.id)
		return nil
	}
}

// halt stops the instance and returns Run's error.
func (in *instance) halt() error {
	in.t.Helper()
	in.exitExpected.Store(true)
	in.stop()
	return in.exit()
}

// shutdown stops the instance and fails the test if Run failed.
func (in *instance) shutdown() {
	in.t.Helper()
	if err := in.halt(); err != nil {
		in.t.Fatalf("instance %s: Run: %v", in.id, err)
	}
}

// crashed waits until Run returned after a simulated crash at point.
func (in *instance) crashed(point string) {
	in.t.Helper()
	if err := in.exit(); !errors.Is(err, ErrCrashed) || !strings.Contains(err.Error(), point) {
		in.t.Fatalf("instance %s stopped with %v, want a simulated crash at %s", in.id, err, point)
	}
}

// metric sums the samples of a metric whose labels include every
// name=value pair of labels.
func (in *instance) metric(name string, labels ...string) float64 {
	in.t.Helper()
	return metricSum(in.t, in.reg, name, labels...)
}

// metricSum sums the samples in reg of a metric whose labels include
// every name=value pair of labels.
func metricSum(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// owned is how many input partitions the instance has restored and
// processes.
func (in *instance) owned() int { return int(in.metric("meterline_stream_owned_partitions")) }

// finish ends a case: the other instances stop, last comes to own every
// partition and counts more input, and once it stopped verify counts.
func (s *suite) finish(last *instance, fs vfs.FS, others ...*instance) {
	s.t.Helper()
	for _, o := range others {
		o.shutdown()
	}
	s.waitFor(last.id+" to own every partition", func() bool { return last.owned() == int(s.parts) })
	s.send(20)
	s.caughtUp()
	last.shutdown()
	s.verify(last, fs)
}

// model is what the suite expects from the inputs sent: each id's output
// value, and each partition's final bucket counts (a reset bucket is
// absent until counted again).
func (s *suite) model() (outputs map[string]string, buckets []map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	outputs = map[string]string{}
	for p := range s.parts {
		counts := map[string]int64{}
		for _, in := range s.sent[p] {
			if strings.HasPrefix(in.id, "!") {
				delete(counts, in.bucket)
				outputs[in.id] = in.bucket + "=0"
				continue
			}
			counts[in.bucket]++
			outputs[in.id] = fmt.Sprintf("%s=%d", in.bucket, counts[in.bucket])
		}
		buckets = append(buckets, counts)
	}
	return outputs, buckets
}

// verify checks, once every instance has stopped, that each input was
// counted exactly once: one committed output per input with the count the
// model expects, each id in exactly one committed Flush summary, and the
// changelog and the local state on fs (of the instance that owned every
// partition last) holding the model's counts and the next input offset.
func (s *suite) verify(lastOwner *instance, fs vfs.FS) {
	t := s.t
	t.Helper()
	want, buckets := s.model()

	got := map[string]string{}
	flushed := map[string]int{}
	for _, r := range testenv.ReadAll(t, s.brokers, s.output) {
		if string(r.Key) == "txn" {
			for _, id := range strings.Split(string(r.Value), ",") {
				flushed[id]++
			}
			continue
		}
		id := string(r.Key)
		if prev, dup := got[id]; dup {
			t.Errorf("input %s has two committed outputs: %s and %s", id, prev, r.Value)
		}
		got[id] = string(r.Value)
	}
	for id, w := range want {
		switch g, ok := got[id]; {
		case !ok:
			t.Errorf("input %s has no committed output (want %s)", id, w)
		case g != w:
			t.Errorf("input %s counted as %s, want %s", id, g, w)
		}
		if flushed[id] != 1 {
			t.Errorf("input %s is in %d committed Flush summaries, want 1", id, flushed[id])
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("output for %s, which was never sent", id)
		}
	}

	// The changelog: the latest record of each key, per partition.
	log := s.changelogState()
	st, err := OpenStore("state-"+lastOwner.id, fs, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for p := range s.parts {
		local, changelog := s.storeState(st, p), log[p]
		for where, state := range map[string]map[string]string{"changelog": changelog, lastOwner.id + "'s local state": local} {
			if next, err := decodeOffset([]byte(state[keyInputOffset])); err != nil || next != s.sentTo(p, false) {
				t.Errorf("partition %d: %s says the next input offset is %d (%v), want %d", p, where, next, err, s.sentTo(p, false))
			}
			if s.extra != "" {
				k := keyInputOffset + "/" + s.extra
				if next, err := decodeOffset([]byte(state[k])); err != nil || next != s.sentTo(p, true) {
					t.Errorf("partition %d: %s says the next input offset of %s is %d (%v), want %d", p, where, s.extra, next, err, s.sentTo(p, true))
				}
			}
			for b := range 6 {
				bucket := fmt.Sprintf("b%d", b%3)
				if b >= 3 {
					bucket = "x" + bucket
				}
				w, ok := buckets[p][bucket]
				switch g, has := state[bucket]; {
				case has != ok:
					t.Errorf("partition %d: %s has bucket %s: %v (%q), want %v", p, where, bucket, has, g, ok)
				case ok && g != strconv.FormatInt(w, 10):
					t.Errorf("partition %d: %s counts %s for bucket %s, want %d", p, where, g, bucket, w)
				}
			}
		}
		if cp, ok, err := st.Checkpoint(p); err != nil || !ok {
			t.Errorf("partition %d: no checkpoint in %s's state (%v)", p, lastOwner.id, err)
		} else if end := s.changelogEnd()[p]; cp.Offset > end {
			t.Errorf("partition %d: checkpoint %d beyond the changelog's end %d", p, cp.Offset, end)
		}
	}
}

// changelogEnd returns the changelog's high watermarks.
func (s *suite) changelogEnd() []int64 {
	s.t.Helper()
	end, err := s.listChangelogEnd()
	if err != nil {
		s.t.Fatal(err)
	}
	return end
}

// listChangelogEnd is changelogEnd for any goroutine.
func (s *suite) listChangelogEnd() ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := s.adm.ListEndOffsets(ctx, s.changelog)
	if err != nil {
		return nil, err
	}
	out := make([]int64, s.parts)
	offs.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}

// changelogState returns each partition's latest value of every key in the
// changelog (a key whose latest record is a tombstone is absent).
func (s *suite) changelogState() []map[string]string {
	s.t.Helper()
	out := make([]map[string]string, s.parts)
	for p := range out {
		out[p] = map[string]string{}
	}
	for _, r := range s.readChangelog() {
		if r.Value == nil {
			delete(out[r.Partition], string(r.Key))
		} else {
			out[r.Partition][string(r.Key)] = string(r.Value)
		}
	}
	return out
}

// changelogRecords counts the changelog's committed records of partition p
// at offsets in [from, to): what a copy of the partition reading that range
// applies.
func (s *suite) changelogRecords(p int32, from, to int64) int {
	s.t.Helper()
	n := 0
	for _, r := range s.readChangelog() {
		if r.Partition == p && r.Offset >= from && r.Offset < to {
			n++
		}
	}
	return n
}

// storeState returns partition p's keys and values in st.
func (s *suite) storeState(st *Store, p int32) map[string]string {
	s.t.Helper()
	out := map[string]string{}
	if err := st.Scan(p, nil, nil, func(k, v []byte) error {
		out[string(k)] = string(v)
		return nil
	}); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// readChangelog returns the changelog's committed records.
func (s *suite) readChangelog() []*kgo.Record {
	s.t.Helper()
	return testenv.ReadAll(s.t, s.brokers, s.changelog)
}

// txnState returns the broker's state of a transactional ID's transaction
// ("Ongoing", "CompleteAbort", …).
func (s *suite) txnState(txnID string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := s.adm.DescribeTransactions(ctx, txnID)
	if err != nil {
		s.t.Fatal(err)
	}
	return d[txnID].State
}

// onlyMember returns the member ID of the group's only member.
func (s *suite) onlyMember() string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dg, err := s.adm.DescribeGroups(ctx, s.group)
	if err != nil {
		s.t.Fatal(err)
	}
	if ms := dg[s.group].Members; len(ms) == 1 {
		return ms[0].MemberID
	}
	s.t.Fatalf("group %s has members %+v, want one", s.group, dg[s.group].Members)
	return ""
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}

// partitionsRestoring reports the partitions rt is restoring with
// changelog records left to replay.
func partitionsRestoring(rt *Runtime) []int32 {
	var out []int32
	rt.EachPartitionStatus(func(p int32, restoring bool, remaining int64, _, _ string) {
		if restoring && remaining > 0 {
			out = append(out, p)
		}
	})
	return out
}
