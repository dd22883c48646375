package stream

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
)

// newTestEndLister returns an endLister of a listBrokers-broker kfake
// changelog of listBrokers partitions, listing every interval, and a
// count of the clients it made that it has not closed yet.
func newTestEndLister(t *testing.T, interval time.Duration) (*endLister, func() int) {
	t.Helper()
	_, brokers, topic := spreadTopic(t, listBrokers)
	var mu sync.Mutex
	open := 0
	l := newEndLister(topic, func() (*kgo.Client, error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.WithHooks(closeHook{func() {
			mu.Lock()
			open--
			mu.Unlock()
		}}))
		if err == nil {
			mu.Lock()
			open++
			mu.Unlock()
		}
		return cl, err
	}, clock.Real{}, zap.NewNop())
	l.interval = interval
	return l, func() int {
		mu.Lock()
		defer mu.Unlock()
		return open
	}
}

// closeHook calls f when its client closes.
type closeHook struct{ f func() }

func (h closeHook) OnClientClosed(*kgo.Client) { h.f() }

// TestEndListerStopRacesSubscribe: tails subscribe and unsubscribe while
// the lister stops, again and again, and while its loop stops by itself
// for want of tails. Whatever the interleaving, a stop that returns has
// waited for every loop it ended, a tail registered afterwards gets its
// listings, and once the last stop returns no loop and no client is left.
func TestEndListerStopRacesSubscribe(t *testing.T) {
	t.Parallel()
	l, open := newTestEndLister(t, time.Millisecond)
	var wg sync.WaitGroup
	stopAt := time.Now().Add(2 * time.Second)
	for p := range int32(listBrokers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stopAt) {
				s := l.subscribe(p)
				time.Sleep(time.Duration(p) * time.Millisecond)
				l.unsubscribe(s)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(stopAt) {
			l.stop()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	wg.Wait()

	// A tail registered after all that is listed.
	s := l.subscribe(0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := s.take(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a tail registered after the lister stopped got no listing within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.unsubscribe(s)
	l.stop()
	l.mu.Lock()
	running := l.running
	l.mu.Unlock()
	if running {
		t.Fatal("the lister runs after stop")
	}
	if n := open(); n != 0 {
		t.Fatalf("%d clients of the lister open after stop returned", n)
	}
}

// TestEndListerNoLeak: many cycles of a tail registering, getting a
// listing, unregistering, and the lister stopping (by stop or for want of
// tails) leave no goroutine and no client behind.
func TestEndListerNoLeak(t *testing.T) {
	l, open := newTestEndLister(t, 5*time.Millisecond)
	// The kfake cluster's goroutines and a first client's warm-up are in
	// the baseline.
	s := l.subscribe(0)
	for {
		if _, ok := s.take(); ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	l.unsubscribe(s)
	l.stop()
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := range 50 {
		ss := make([]*endSub, listBrokers)
		for p := range ss {
			ss[p] = l.subscribe(int32(p))
		}
		for _, s := range ss {
			for {
				if _, ok := s.take(); ok {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		for _, s := range ss {
			l.unsubscribe(s)
		}
		if i%2 == 0 {
			l.stop()
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for { // the loop stops by itself at its next interval
			l.mu.Lock()
			running := l.running
			l.mu.Unlock()
			if !running {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the lister still runs 5 s after its last tail unregistered")
			}
			time.Sleep(time.Millisecond)
		}
	}
	l.stop()
	if n := open(); n != 0 {
		t.Fatalf("%d clients of the lister open after stop returned", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after 50 cycles, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
