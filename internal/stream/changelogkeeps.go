package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/topics"
)

// A changelog's cleanup.policy and retention.ms, checked while the stage
// runs (Config.ChangelogMustKeep; docs/operations.md, Topics). The stage
// checks them at start (topics.CheckChangelogKeeps); an operator may change
// them later. A changelog whose policy deletes records sooner than the
// stage needs them loses state records, and the next restore (after a
// crash, on another host, at a rebalance) would rebuild the state without
// them. So the runtime reads them every Config.ChangelogCheckInterval
// (the clock only decides when) and exports meterline_stream_changelog_unsafe,
// logging an error when they turn unsafe and a line when they are safe
// again; and each restore reads them too (at most once per
// keepsRestoreAge, for every partition the rebalance gives) and is refused
// while they are unsafe, as the start is.

// keepsRestoreAge is how old a check a restore may reuse: the restores of
// one rebalance share one read.
const keepsRestoreAge = 10 * time.Second

type keepsWatch struct {
	mu        sync.Mutex
	checkedAt time.Time // last read that answered; zero: none
	unsafe    error     // what that read judged: nil when safe
	logged    bool      // an unsafe judgement was logged and not cleared since
}

// checkKeeps returns the changelog's judgement (topics.ChangelogKeeps: a
// *topics.ChangelogRetentionError when unsafe), read from the brokers
// unless the last read is younger than maxAge. A read that fails keeps the
// last judgement (none: nil) and is logged at debug level: the start's
// check warned about a missing ACL already.
func (rt *Runtime) checkKeeps(ctx context.Context, adm *kadm.Client, maxAge time.Duration) error {
	if rt.cfg.ChangelogMustKeep == 0 {
		return nil
	}
	k := &rt.keeps
	k.mu.Lock()
	defer k.mu.Unlock()
	now := rt.cfg.Clock.Now()
	if age := now.Sub(k.checkedAt); !k.checkedAt.IsZero() && age >= 0 && age < maxAge {
		return k.unsafe
	}
	need := rt.cfg.ChangelogMustKeep
	if need == KeepForever {
		need = 0
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	unsafe, err := topics.ReadChangelogKeeps(rctx, adm, rt.cfg.Stage, rt.cfg.ChangelogTopic, need)
	cancel()
	if err != nil {
		rt.log.Debug("cannot read the changelog's cleanup.policy and retention.ms", zap.String("changelog", rt.cfg.ChangelogTopic), zap.Error(err))
		return k.unsafe
	}
	k.checkedAt, k.unsafe = now, unsafe
	v := 0.0
	if unsafe != nil {
		v = 1
	}
	rt.m.changelogUnsafe.WithLabelValues(rt.cfg.ChangelogTopic).Set(v)
	switch {
	case unsafe != nil && !k.logged:
		k.logged = true
		rt.log.Error("the changelog's cleanup policy now deletes state records a restore must read: the next restore of a partition is refused, and the stage with it (set it back)",
			zap.String("changelog", rt.cfg.ChangelogTopic), zap.Error(unsafe))
	case unsafe == nil && k.logged:
		k.logged = false
		rt.log.Info("the changelog's cleanup policy keeps the state records a restore reads again", zap.String("changelog", rt.cfg.ChangelogTopic))
	}
	return unsafe
}

// keepsForRestore returns the error that refuses a restore of partition
// p from a changelog that deletes state records sooner than the stage
// needs them; nil when it keeps them or its configs cannot be read.
func (rt *Runtime) keepsForRestore(ctx context.Context, adm *kadm.Client, p int32) error {
	unsafe := rt.checkKeeps(ctx, adm, keepsRestoreAge)
	var re *topics.ChangelogRetentionError
	if !errors.As(unsafe, &re) {
		return nil
	}
	return fmt.Errorf("stream: partition %d: restore refused: %w", p, unsafe)
}

// ChangelogUnsafe returns the last judgement of the changelog's
// cleanup.policy and retention.ms when it deletes state records a restore
// must read (a *topics.ChangelogRetentionError); nil otherwise. The status
// page shows it.
func (rt *Runtime) ChangelogUnsafe() error {
	rt.keeps.mu.Lock()
	defer rt.keeps.mu.Unlock()
	return rt.keeps.unsafe
}

// startWatchKeeps runs checkKeeps every Config.ChangelogCheckInterval
// until ctx ends or the returned function is called, which returns once
// it stopped. Nothing when Config.ChangelogMustKeep is zero.
func (rt *Runtime) startWatchKeeps(ctx context.Context, adm *kadm.Client) (stop func()) {
	if rt.cfg.ChangelogMustKeep == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(rt.cfg.ChangelogCheckInterval)
		defer tick.Stop()
		for {
			rt.checkKeeps(ctx, adm, 0)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
