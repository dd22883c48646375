package stream

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fatalLog counts kgo's "fatal InitProducerID error" messages: a sink
// found the failed producer ID and failed the records it could see.
type fatalLog struct {
	n      atomic.Int64
	failed atomic.Bool
}

func (l *fatalLog) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l *fatalLog) Log(_ kgo.LogLevel, msg string, _ ...any) {
	switch {
	case strings.HasPrefix(msg, "fatal InitProducerID error"):
		l.n.Add(1)
	case strings.HasPrefix(msg, "producer ID failed due to a produce error"):
		l.failed.Store(true)
	case strings.HasPrefix(msg, "producer id initialization success"):
		l.failed.Store(false)
	}
}

// strandPartitioner partitions as the runtime does (manually), but, for
// the changelog topic of a client created while armed, holds the
// metadata goroutine where kgo has handed the topic's first held record
// to a sink and not yet stored the topic's partitions
// (storePartitionsUpdate): the first record waits until the producer ID
// failed (rt's transaction saw OUT_OF_ORDER_SEQUENCE_NUMBER), the second
// until a sink failed the buffered records it could see, and is then
// refused its partition, so that no record buffered later starts a
// drain. The first record stays buffered in kgo, as under a loaded
// machine's scheduling.
type strandPartitioner struct {
	topic string
	armed *atomic.Bool
	log   *fatalLog
}

func (p *strandPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	tp := kgo.ManualPartitioner().ForTopic(topic)
	if topic != p.topic || !p.armed.Load() {
		return tp
	}
	return &strandTopic{TopicPartitioner: tp, p: p}
}

type strandTopic struct {
	kgo.TopicPartitioner
	p     *strandPartitioner
	n     int
	gated bool
	fatal int64
}

func (s *strandTopic) Partition(r *kgo.Record, n int) int {
	s.n++
	switch s.n {
	case 1:
		s.gated = s.p.log.failed.Load()
		s.fatal = s.p.log.n.Load()
	default:
		if !s.gated {
			break
		}
		if s.n == 2 {
			poll(time.Second, func() bool { return s.p.log.n.Load() > s.fatal })
			time.Sleep(200 * time.Millisecond) // the sink's pass over the stored partitions
		}
		return -1
	}
	return s.TopicPartitioner.Partition(r, n)
}

// poll waits until cond holds or d passed.
func poll(d time.Duration, cond func() bool) {
	for deadline := time.Now().Add(d); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// A record that failed the producer ID (OUT_OF_ORDER_SEQUENCE_NUMBER) ends
// the transaction's wait at once, although kgo keeps a record of it
// buffered that neither Flush nor End's abort returns for: the session is
// rebuilt for out_of_order_sequence within a few seconds, not after the
// flush and end bounds (23 s here) for commit_unknown; nothing of those
// transactions commits, and a restart counts every input once.
func TestProducerIDFailureDoesNotWaitForStrandedRecords(t *testing.T) {
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	var armed atomic.Bool
	logs := &fatalLog{}
	part := &strandPartitioner{topic: s.changelog, armed: &armed, log: logs}
	// The last input of the batch waits until the producer ID failed, so
	// that the changelog's records are produced after kgo failed what it
	// held.
	proc := &countProc{output: s.output, hold: func(id string) {
		if id == "i0039" && armed.Load() {
			poll(2*time.Second, logs.failed.Load)
		}
	}}
	a := s.startRuntime("a", fs, proc, func(c *Config) {
		c.ClientOptions = []kgo.Opt{kgo.RecordPartitioner(part), kgo.WithLogger(logs)}
	}, nil)
	s.send(20)
	s.caughtUp()
	var once atomic.Bool
	refuseSequences(t, s, s.group+"-a", s.output, &armed, &once)
	armed.Store(true)
	start := time.Now()
	s.send(20)
	// maxSequenceRestarts sessions, each ending with the refusal, and the
	// stage stops: within seconds, not after the flush and end bounds.
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stage did not stop within %v (%s)", time.Since(start).Round(time.Millisecond), restartsByReason(t, a))
	}
	if logs.n.Load() == 0 {
		t.Error("kgo never failed the buffered records for the failed producer ID")
	}
	if err := a.exit(); !errors.Is(err, kerr.OutOfOrderSequenceNumber) {
		t.Fatalf("a stopped with %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", err)
	}
	if n := a.metric("meterline_stream_session_restarts_total", "reason", "out_of_order_sequence"); n != maxSequenceRestarts {
		t.Errorf("the session was rebuilt %v times for out_of_order_sequence, want %d (%s)", n, maxSequenceRestarts, restartsByReason(t, a))
	}
	if n := a.metric("meterline_stream_session_restarts_total", "reason", "commit_unknown"); n != 0 {
		t.Errorf("the session was rebuilt %v times for commit_unknown, want 0 (%s)", n, restartsByReason(t, a))
	}
	armed.Store(false)
	a = s.start("a", fs)
	s.finish(a, fs)
}
