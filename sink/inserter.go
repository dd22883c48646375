package sink

import (
	"context"
	"sync"
	"sync/atomic"
)

// The inserter goroutine: INSERT batches are written in order on a
// goroutine of their own while the run loop polls and decodes the next
// batch (at most one batch written and one queued, so a slow ClickHouse
// holds back polling).
//
// Guarantee kept here: a window's transaction waits (inserter.wait) until
// every batch dispatched in the window is written, or dropped after the
// window's first error, in which case the window does not commit its rows.

// inserter writes INSERT batches on its own goroutine, in order, while the
// run loop polls and decodes the next batch. A window's transaction waits
// for every batch dispatched in the window.
type inserter struct {
	w      *Writer
	ctx    context.Context
	cancel context.CancelFunc
	jobs   chan *pending
	wg     sync.WaitGroup // dispatched batches not yet written
	done   chan struct{}
	mu     sync.Mutex
	parks  []parked
	err    error // the first error of the window; later batches are dropped
	// stops: per partition, the window's first refused (parked) row; the
	// partition's later rows are held back. Written by the inserter
	// goroutine only.
	stops   map[tp]stop
	held    int         // rows held back in the window
	stopped atomic.Bool // stops is not empty: the window should end
}

func (w *Writer) startInserter(ctx context.Context) *inserter {
	ctx, cancel := context.WithCancel(ctx)
	ins := &inserter{w: w, ctx: ctx, cancel: cancel, jobs: make(chan *pending, 1), done: make(chan struct{}), stops: map[tp]stop{}}
	go ins.run()
	return ins
}

func (ins *inserter) run() {
	defer close(ins.done)
	for p := range ins.jobs {
		for _, t := range ins.w.tables {
			rows := p.rows[t]
			ins.mu.Lock()
			failed := ins.err != nil
			ins.mu.Unlock()
			if len(rows) == 0 || failed {
				continue
			}
			ins.mu.Lock()
			stops := ins.stops
			ins.mu.Unlock()
			ft, err := ins.w.writeTable(ins.ctx, t, rows, stops)
			ins.mu.Lock()
			if ft != nil {
				ins.parks = append(ins.parks, ft.parks...)
				for k, st := range ft.stops {
					ins.stops[k] = st
				}
				ins.held += ft.held
				if len(ins.stops) > 0 {
					ins.stopped.Store(true)
				}
			}
			if err != nil && ins.err == nil {
				ins.err = err
			}
			ins.mu.Unlock()
		}
		ins.mu.Lock()
		failed := ins.err != nil
		ins.mu.Unlock()
		if len(p.quarantine) > 0 && !failed {
			if err := ins.w.writeQuarantine(ins.ctx, p.quarantine); err != nil {
				ins.mu.Lock()
				if ins.err == nil {
					ins.err = err
				}
				ins.mu.Unlock()
			}
		}
		ins.w.resumeFetching()
		ins.wg.Done()
	}
}

// dispatch hands a batch to the inserter, blocking while it is busy with
// one batch and has another queued.
//
// It never waits forever: the inserter finishes each INSERT within
// InsertTimeout, and leaves its back-off when ctx ends or the partitions
// are revoked.
func (ins *inserter) dispatch(p *pending) {
	ins.wg.Add(1)
	ins.jobs <- p
}

// wait waits until every dispatched batch is written (or dropped after an
// error) and returns the window's refused rows, the partitions held back
// behind them, and its first error.
func (ins *inserter) wait() ([]parked, map[tp]stop, int, error) {
	ins.wg.Wait()
	ins.mu.Lock()
	defer ins.mu.Unlock()
	parks, stops, held, err := ins.parks, ins.stops, ins.held, ins.err
	ins.parks, ins.stops, ins.held, ins.err = nil, map[tp]stop{}, 0, nil
	ins.stopped.Store(false)
	return parks, stops, held, err
}

// close stops the inserter: a batch in back-off is abandoned (its window
// is never committed, so its records are re-consumed).
func (ins *inserter) close() {
	ins.cancel()
	close(ins.jobs)
	<-ins.done
}
