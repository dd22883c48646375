package stream

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
)

// The standbys of a runtime share their listing of the changelog's end.
//
// A standby tail needs its partition's end every standbyListInterval, to
// date its checkpoint and report its lag. A fenced listing (listFenced)
// asks every broker for the changelog's metadata and each partition's
// leader for its offsets: done by each tail for its own partition, N
// standby partitions on B brokers cost N×B metadata requests and N
// ListOffsets every interval. So the tails register with one endLister,
// which lists every registered partition at once each interval, on a
// client of its own: B metadata requests and one ListOffsets per leader,
// whatever N. The fencing is listFenced's, partition by partition: a
// broker behind the current leader epoch is not asked, and one that
// answers at another epoch answers an error, which is not passed on.
//
// A listing never holds one partition back for another. Each leader's
// answer is handed to its partitions' tails as it arrives; a partition
// whose listing failed (no leader, an error, a leader that did not
// answer) gets nothing that interval: its tail keeps its target and lag,
// and the next interval lists it again. A round whose leader does not
// answer (paused) goes on, for up to standbyListTimeout, without the
// next rounds waiting for it: they list the other partitions, and its
// own once it has ended.
//
// A tail registers once it has planned its copy and unregisters when it
// stops (neither waits on the broker); a round that lists a partition
// whose tail has gone drops the answer. The lister runs while tails are
// registered, and stops, closing its client, at the first interval
// without any; stop ends it at once.

// standbyListTimeout bounds one round of the standbys' shared listing.
const standbyListTimeout = 10 * time.Second

// listedEnd is a changelog partition's end, listed at time at (the clock,
// read before the listing).
type listedEnd struct {
	end int64
	at  time.Time
}

// endSub is one tail's registration with an endLister.
type endSub struct {
	p int32
	// busy (under endLister.mu): a round under way lists p for it.
	busy bool
	// got holds the latest listing not yet taken; ready is signalled
	// when one is given, to end the tail's poll.
	got   chan listedEnd
	ready chan struct{}
}

// take returns the latest listing handed to the tail since the last take.
func (s *endSub) take() (listedEnd, bool) {
	select {
	case l := <-s.got:
		return l, true
	default:
		return listedEnd{}, false
	}
}

// give hands l to the tail, in place of a listing it has not taken, and
// wakes its poll. Only the round that set busy calls it.
func (s *endSub) give(l listedEnd) {
	select {
	case <-s.got:
	default:
	}
	s.got <- l
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// endLister lists the changelog's end for the standby tails registered
// with it, every interval, in one fenced listing.
type endLister struct {
	topic     string
	newClient func() (*kgo.Client, error)
	clock     clock.Clock
	log       *zap.Logger
	interval  time.Duration

	mu      sync.Mutex
	subs    map[*endSub]struct{}
	running bool               // a loop runs
	cancel  context.CancelFunc // the loop's
	// loops holds the done channel of each loop that has not returned
	// yet: the running one, and those ended (by stop or for want of
	// tails) still closing their client. A stop waits for those it saw,
	// not for a loop a later subscribe starts (a WaitGroup's Wait would
	// race that subscribe's Add).
	loops map[chan struct{}]struct{}
}

func newEndLister(topic string, newClient func() (*kgo.Client, error), clk clock.Clock, log *zap.Logger) *endLister {
	return &endLister{topic: topic, newClient: newClient, clock: clk, log: log, interval: standbyListInterval,
		subs: map[*endSub]struct{}{}, loops: map[chan struct{}]struct{}{}}
}

// subscribe registers a tail of partition p; its listings arrive from the
// next interval on.
func (l *endLister) subscribe(p int32) *endSub {
	s := &endSub{p: p, got: make(chan listedEnd, 1), ready: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.subs[s] = struct{}{}
	if !l.running {
		ctx, cancel := context.WithCancel(context.Background())
		l.running, l.cancel = true, cancel
		done := make(chan struct{})
		l.loops[done] = struct{}{}
		go l.loop(ctx, done)
	}
	return s
}

// unsubscribe forgets s; a round under way that lists it drops its answer.
func (l *endLister) unsubscribe(s *endSub) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.subs, s)
}

// stop ends the lister and waits for it: its requests are cancelled and
// its client closed. A tail that registers afterwards starts it again.
func (l *endLister) stop() {
	l.mu.Lock()
	if l.running {
		l.cancel()
		l.running = false
	}
	loops := make([]chan struct{}, 0, len(l.loops))
	for done := range l.loops {
		loops = append(loops, done)
	}
	l.mu.Unlock()
	for _, done := range loops {
		<-done
	}
}

// due returns the registered tails no round is listing, marked busy, and
// whether the loop with ctx goes on: not once stop ended it, nor with no
// tail registered (it is then marked stopped: the next subscribe starts
// another).
func (l *endLister) due(ctx context.Context) ([]*endSub, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ctx.Err() != nil {
		return nil, false
	}
	if len(l.subs) == 0 {
		l.running = false
		l.cancel()
		return nil, false
	}
	var out []*endSub
	for s := range l.subs {
		if !s.busy {
			s.busy = true
			out = append(out, s)
		}
	}
	return out, true
}

// release marks the tails of a round free for the next.
func (l *endLister) release(ss []*endSub) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range ss {
		s.busy = false
	}
}

func (l *endLister) loop(ctx context.Context, done chan struct{}) {
	var rounds sync.WaitGroup
	var cl *kgo.Client
	defer func() {
		rounds.Wait()
		if cl != nil {
			cl.Close()
		}
		l.mu.Lock()
		delete(l.loops, done)
		l.mu.Unlock()
		close(done)
	}()
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		subs, ok := l.due(ctx)
		if !ok {
			return
		}
		if len(subs) == 0 {
			continue // every tail's listing is still under way
		}
		if cl == nil {
			var err error
			if cl, err = l.newClient(); err != nil {
				l.log.Warn("standbys cannot list the changelog's end", zap.Error(err))
				l.release(subs)
				continue
			}
		}
		rounds.Add(1)
		go func() {
			defer rounds.Done()
			l.round(ctx, cl, subs)
		}()
	}
}

// round lists the end of subs' partitions, fenced, and hands each
// partition's answer to its tails as its leader's answer arrives.
func (l *endLister) round(ctx context.Context, cl *kgo.Client, subs []*endSub) {
	ctx, cancel := context.WithTimeout(ctx, standbyListTimeout)
	defer cancel()
	at := l.clock.Now()
	byP := map[int32][]*endSub{}
	ps := make([]int32, 0, len(subs))
	for _, s := range subs {
		if _, ok := byP[s.p]; !ok {
			ps = append(ps, s.p)
		}
		byP[s.p] = append(byP[s.p], s)
	}
	err := listFencedEach(ctx, cl, l.topic, ps, listEnd, func(o kadm.ListedOffset) {
		ss := byP[o.Partition]
		if o.Err == nil {
			for _, s := range ss {
				s.give(listedEnd{end: o.Offset, at: at})
			}
		}
		delete(byP, o.Partition)
		l.release(ss)
	})
	if err != nil && ctx.Err() == nil {
		l.log.Debug("standbys' listing of the changelog's end failed; listing again next interval", zap.Error(err))
	}
	var rest []*endSub
	for _, ss := range byP {
		rest = append(rest, ss...)
	}
	l.release(rest)
}
