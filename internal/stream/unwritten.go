package stream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// refusalDiagnosis bounds the questions writeRefusalCause asks the brokers.
const refusalDiagnosis = 5 * time.Second

// refusalShown bounds the partitions named in writeRefusalCause's log lines.
const refusalShown = 10

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
// log names it).
func (rt *Runtime) writeRefusalCause(ctx context.Context, adm *kadm.Client) {
	if adm == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refusalDiagnosis)
	defer cancel()
	topics := append(slices.Clone(rt.cfg.OutputTopics), rt.cfg.ChangelogTopic)
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		rt.log.Debug("cannot describe the topics the stage writes to explain the failed transaction", zap.Error(err))
		return
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
	var below, leaderless []string
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
	if len(below) > 0 {
		rt.log.Warn("the brokers refuse the stage's writes: partitions it writes to have fewer in-sync replicas than their min.insync.replicas (NOT_ENOUGH_REPLICAS); nothing commits until enough replicas are back in sync",
			zap.Int("partitions_below_min_insync", len(below)), zap.Strings("partitions", below[:min(len(below), refusalShown)]))
	}
	if len(leaderless) > 0 {
		rt.log.Warn("partitions the stage writes to have no leader; nothing commits until a replica in sync is elected",
			zap.Int("partitions_without_leader", len(leaderless)), zap.Strings("partitions", leaderless[:min(len(leaderless), refusalShown)]))
	}
}
