package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// refusalDiagnosis bounds the questions writeRefusalCause asks the brokers.
const refusalDiagnosis = 5 * time.Second

// refusalShown bounds the partitions named in writeRefusalCause's log lines.
const refusalShown = 10

// writeRefusal is why the brokers refuse the stage's writes, as the last
// diagnosis found it (writeRefusalCause): partitions of the topics it
// writes to below their min.insync.replicas, and without a leader. It
// holds until a transaction commits, or a diagnosis finds neither.
type writeRefusal struct {
	since             time.Time
	below, leaderless []string
}

// Causes of a refused write: the cause label of
// meterline_stream_write_refused_partitions.
const (
	refusedBelowMinISR = "below_min_insync"
	refusedNoLeader    = "no_leader"
)

// writeRefusalCause asks the brokers, through adm, why a transaction's
// records could not be written within the transaction timeout
// (errUnwritten), or its end or the transactional ID's initialisation
// failed (the coordinator could not write a transaction's markers), and
// logs what an operator can act on: the partitions of the topics the stage
// writes whose in-sync replicas are fewer than their min.insync.replicas
// (the brokers refuse every acks=all write there, markers included, with
// NOT_ENOUGH_REPLICAS, which kgo and the coordinator retry without a word
// at the stage's log level), and those without a leader. It says nothing
// when the brokers show neither (an unreachable broker: the client's own
// log names it). What it finds stays the stage's write refusal (Ready,
// WriteRefused) until a transaction commits.
func (rt *Runtime) writeRefusalCause(ctx context.Context, adm *kadm.Client) {
	rt.diagnoseRefusal(ctx, adm, rt.refusalGen.Load(), true)
}

// diagnoseRefusal asks the brokers why the stage's writes are refused and
// records the answer as the write refusal, unless a transaction committed
// since gen (refusalGen) was read. It logs the partitions when logAlways,
// or when the stage was not known to be refused before.
func (rt *Runtime) diagnoseRefusal(ctx context.Context, adm *kadm.Client, gen uint64, logAlways bool) {
	if adm == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refusalDiagnosis)
	defer cancel()
	below, leaderless, err := rt.refusedPartitions(ctx, adm)
	if err != nil {
		rt.log.Debug("cannot describe the topics the stage writes to explain the failed transaction", zap.Error(err))
		return
	}
	was := rt.setRefusal(gen, below, leaderless)
	if !logAlways && was {
		return
	}
	if len(below) > 0 {
		rt.log.Warn("the brokers refuse the stage's writes: partitions it writes to have fewer in-sync replicas than their min.insync.replicas (NOT_ENOUGH_REPLICAS); nothing commits until enough replicas are back in sync",
			zap.Int("partitions_below_min_insync", len(below)), zap.Strings("partitions", below[:min(len(below), refusalShown)]))
	}
	if len(leaderless) > 0 {
		rt.log.Warn("partitions the stage writes to have no leader; nothing commits until a replica in sync is elected",
			zap.Int("partitions_without_leader", len(leaderless)), zap.Strings("partitions", leaderless[:min(len(leaderless), refusalShown)]))
	}
}

// refusedPartitions returns the partitions of the topics the stage writes
// to whose in-sync replicas are fewer than their min.insync.replicas, and
// those without a leader, as the brokers describe them.
func (rt *Runtime) refusedPartitions(ctx context.Context, adm *kadm.Client) (below, leaderless []string, err error) {
	topics := append(slices.Clone(rt.cfg.OutputTopics), rt.cfg.ChangelogTopic)
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, nil, err
	}
	minISR := map[string]int{}
	if rcs, err := adm.DescribeTopicConfigs(ctx, topics...); err == nil {
		for _, rc := range rcs {
			for _, c := range rc.Configs {
				if c.Key == "min.insync.replicas" && c.Value != nil {
					if n, err := strconv.Atoi(*c.Value); err == nil {
						minISR[rc.Name] = n
					}
				}
			}
		}
	}
	for _, topic := range td.Sorted() {
		for _, p := range topic.Partitions.Sorted() {
			// Kafka requires at most as many in-sync replicas as the
			// partition has replicas.
			need := min(minISR[topic.Topic], len(p.Replicas))
			switch {
			case p.Leader < 0:
				leaderless = append(leaderless, fmt.Sprintf("%s/%d: replicas %v, in sync %v", topic.Topic, p.Partition, p.Replicas, p.ISR))
			case len(p.ISR) < need:
				below = append(below, fmt.Sprintf("%s/%d: in sync %v of replicas %v, min.insync.replicas %d",
					topic.Topic, p.Partition, p.ISR, p.Replicas, minISR[topic.Topic]))
			}
		}
	}
	return below, leaderless, nil
}

// setRefusal records the partitions a diagnosis found refusing writes
// (none: the refusal is over), unless a transaction committed since gen
// was read. It returns whether the stage was known to be refused before.
func (rt *Runtime) setRefusal(gen uint64, below, leaderless []string) (was bool) {
	rt.refusalMu.Lock()
	defer rt.refusalMu.Unlock()
	was = rt.refusal != nil
	if rt.refusalGen.Load() != gen {
		return was
	}
	if len(below) == 0 && len(leaderless) == 0 {
		rt.refusal = nil
	} else {
		since := time.Now()
		if was {
			since = rt.refusal.since
		}
		rt.refusal = &writeRefusal{since: since, below: below, leaderless: leaderless}
	}
	rt.m.writeRefused.WithLabelValues(refusedBelowMinISR).Set(float64(len(below)))
	rt.m.writeRefused.WithLabelValues(refusedNoLeader).Set(float64(len(leaderless)))
	return was
}

// writesCommitted ends the write refusal: a transaction committed.
func (rt *Runtime) writesCommitted() {
	rt.refusalMu.Lock()
	defer rt.refusalMu.Unlock()
	rt.refusalGen.Add(1)
	if rt.refusal == nil {
		return
	}
	rt.log.Info("the stage's writes commit again", zap.Duration("refused_for", time.Since(rt.refusal.since).Round(time.Millisecond)))
	rt.refusal = nil
	rt.m.writeRefused.WithLabelValues(refusedBelowMinISR).Set(0)
	rt.m.writeRefused.WithLabelValues(refusedNoLeader).Set(0)
}

// WriteRefused returns why the brokers refuse the stage's writes, as the
// last diagnosis of a transaction that could not be written found it; nil
// when they do not, or since a transaction committed. It backs /readyz and
// the status page.
func (rt *Runtime) WriteRefused() error {
	rt.refusalMu.Lock()
	r := rt.refusal
	rt.refusalMu.Unlock()
	if r == nil {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cannot write for %s", time.Since(r.since).Round(time.Second))
	if len(r.below) > 0 {
		fmt.Fprintf(&b, "; the brokers refuse its writes with NOT_ENOUGH_REPLICAS: %d partitions it writes to have fewer in-sync replicas than their min.insync.replicas (%s)",
			len(r.below), shortStrings(r.below))
	}
	if len(r.leaderless) > 0 {
		fmt.Fprintf(&b, "; %d partitions it writes to have no leader (%s)", len(r.leaderless), shortStrings(r.leaderless))
	}
	b.WriteString("; nothing commits until they are back in sync")
	return errors.New(b.String())
}

// shortStrings joins up to refusalShown of ss, and says how many more.
func shortStrings(ss []string) string {
	if len(ss) <= refusalShown {
		return strings.Join(ss, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(ss[:refusalShown], "; "), len(ss)-refusalShown)
}

// writeStallAfter is how long a transaction's flush waits before the
// runtime asks the brokers why its records are not written (diagnoseStall),
// at most: half the transaction timeout when shorter.
const writeStallAfter = 5 * time.Second

// diagnoseStall asks the brokers, once the flush of a transaction has
// waited for writeStallAfter (or half the transaction timeout), why its
// records are not written, while it goes on waiting: the write refusal
// then shows before the transaction times out. It returns the function
// that stops it when the flush ends first.
func (rt *Runtime) diagnoseStall(adm *kadm.Client) (stop func()) {
	gen := rt.refusalGen.Load()
	t := time.AfterFunc(min(writeStallAfter, rt.cfg.TransactionTimeout/2), func() {
		rt.diagnoseRefusal(context.Background(), adm, gen, false)
	})
	return func() { t.Stop() }
}
