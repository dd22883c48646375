// Package topics knows the topics of docs/design.md, Topics: their names,
// partitions and configs. It creates them and reports drift between what a
// cluster has and what Meterline needs.
package topics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Names are the topic names. Each is configurable; Prefix is prepended to
// all of them.
type Names struct {
	Prefix             string `help:"Prefix prepended to every topic name." default:""`
	Events             string `help:"Usage events from producers, keyed by identity." default:"usage.events"`
	Deduped            string `help:"First copies of events and watermarks, keyed by customer." default:"usage.deduped.v2"`
	Duplicates         string `help:"Every dropped copy." default:"usage.duplicates"`
	Rejected           string `help:"Bad input with a reason code." default:"usage.rejected"`
	Aggregates         string `help:"Aggregate revisions (OPEN, FINAL)." default:"usage.aggregates"`
	Adjustments        string `help:"Late events booked into a later period." default:"usage.adjustments"`
	DedupChangelog     string `help:"Dedup state changelog." default:"meterline-dedup-changelog-v2"`
	AggregateChangelog string `help:"Aggregator state changelog." default:"meterline-aggregate-changelog-v2"`
	Entitlements       string `help:"Customers' plans, caps and credit grants, the default plan and the rate card (compacted, co-partitioned with the deduped topic)." default:"usage.entitlements"`
	Balances           string `help:"Customers' usage against their caps and credits left (compacted)." default:"usage.balances"`
	Keys               string `help:"API keys and tenants of the HTTP ingest (compacted)." default:"meterline.keys"`
}

// DefaultNames returns the default names (docs/design.md, Topics). The
// deduped topic and the two changelogs carry ".v2"/"-v2": usage.deduped is
// keyed by customer (docs/design.md, Topics), a key scheme that starts on
// new topics rather than mix with the records and state of the earlier one
// (customer and meter), which the stages refuse (schemas.ErrKeyScheme).
func DefaultNames() Names {
	return Names{Events: "usage.events", Deduped: "usage.deduped.v2", Duplicates: "usage.duplicates",
		Rejected: "usage.rejected", Aggregates: "usage.aggregates", Adjustments: "usage.adjustments",
		DedupChangelog: "meterline-dedup-changelog-v2", AggregateChangelog: "meterline-aggregate-changelog-v2",
		Entitlements: "usage.entitlements", Balances: "usage.balances", Keys: "meterline.keys"}
}

func (n Names) name(s string) string { return n.Prefix + s }

// EventsTopic and the others return the full names, prefix included.
func (n Names) EventsTopic() string             { return n.name(n.Events) }
func (n Names) DedupedTopic() string            { return n.name(n.Deduped) }
func (n Names) DuplicatesTopic() string         { return n.name(n.Duplicates) }
func (n Names) RejectedTopic() string           { return n.name(n.Rejected) }
func (n Names) AggregatesTopic() string         { return n.name(n.Aggregates) }
func (n Names) AdjustmentsTopic() string        { return n.name(n.Adjustments) }
func (n Names) DedupChangelogTopic() string     { return n.name(n.DedupChangelog) }
func (n Names) AggregateChangelogTopic() string { return n.name(n.AggregateChangelog) }
func (n Names) EntitlementsTopic() string       { return n.name(n.Entitlements) }
func (n Names) BalancesTopic() string           { return n.name(n.Balances) }
func (n Names) KeysTopic() string               { return n.name(n.Keys) }

// Layout says how many partitions and what retention the topics get. As
// flags, Window, Skew and Bucket default to dedup's W, S and B (the kong
// variables dedup_window, dedup_skew and dedup_bucket, from
// dedup.DefaultWindow, dedup.DefaultSkew and dedup.DefaultBucket; this
// package is below dedup).
type Layout struct {
	Partitions        int32         `help:"Partitions of every topic; changelogs always match their input topic." default:"16"`
	ReplicationFactor int16         `help:"Replication factor of every topic; -1: 3 on a cluster of three or more brokers, else as many as it has (docs/operations.md, Replication)." default:"-1"`
	MinInsyncReplicas int16         `name:"min-insync-replicas" help:"min.insync.replicas of every topic: how many replicas must have a write before acks=all succeeds; -1: 2 when the replication factor is 3 or more, else 1." default:"-1"`
	Window            time.Duration `help:"Dedup window W: topics that must hold W keep at least this plus the margin." default:"${dedup_window}"`
	Skew              time.Duration `help:"Allowed event-time skew S after arrival." default:"${dedup_skew}"`
	Bucket            time.Duration `help:"Dedup's expiry bucket B: a key is dropped with its whole first-arrival bucket, up to W + S + B after that arrival, so the dedup changelog keeps at least W + S + B." default:"${dedup_bucket}" hidden:""`
	RetentionMargin   time.Duration `help:"Retention kept beyond W (+S+B for the dedup changelog)." default:"168h"`
	EventsTimestamp   string        `help:"message.timestamp.type of the events, deduped, entitlements and balances topics, whose record timestamps are broker times (arrival). LogAppendTime in production; tests that drive time use CreateTime." default:"LogAppendTime" enum:"LogAppendTime,CreateTime"`
}

// DefaultLayout returns the defaults of the flags above. Window, Skew and
// Bucket are dedup.DefaultWindow, dedup.DefaultSkew and dedup.DefaultBucket,
// which this package cannot import: internal/cli's
// TestFlagDefaultsAreThePackages holds them equal.
func DefaultLayout() Layout {
	return Layout{Partitions: 16, ReplicationFactor: -1, MinInsyncReplicas: -1, Window: 35 * 24 * time.Hour, Skew: time.Hour,
		Bucket: 24 * time.Hour, RetentionMargin: 7 * 24 * time.Hour, EventsTimestamp: "LogAppendTime"}
}

// DefaultReplication returns the replication (docs/operations.md,
// Replication) for a cluster of the given number of brokers: a replication
// factor of 3 and min.insync.replicas 2 from three brokers on (a write
// acknowledged with acks=all survives the loss of any one broker, and
// writes go on without it); on fewer, one replica per broker and
// min.insync.replicas 1.
func DefaultReplication(brokers int) (rf, minInsync int16) {
	rf = int16(max(1, min(brokers, 3)))
	return rf, DefaultMinInsync(rf)
}

// DefaultMinInsync returns the min.insync.replicas for a replication
// factor: 2 from a replication factor of 3 on, else 1 (with two replicas,
// requiring both would stop every write when either broker is down).
func DefaultMinInsync(rf int16) int16 {
	if rf >= 3 {
		return 2
	}
	return 1
}

// Resolve returns l with its replication decided for a cluster of the
// given number of brokers: a ReplicationFactor or MinInsyncReplicas ≤ 0
// takes DefaultReplication's value. It fails when the replication factor
// needs more brokers than the cluster has, min.insync.replicas exceeds
// the replication factor (no write could ever succeed), or Window, Skew or
// Bucket is not positive.
func (l Layout) Resolve(brokers int) (Layout, error) {
	if l.ReplicationFactor <= 0 {
		l.ReplicationFactor, _ = DefaultReplication(brokers)
	}
	if l.MinInsyncReplicas <= 0 {
		l.MinInsyncReplicas = DefaultMinInsync(l.ReplicationFactor)
	}
	var errs []error
	// Dedup refuses a zero W, S or B (a zero in its Config is the
	// default), so retentions computed from one would be too short.
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"window", l.Window}, {"skew", l.Skew}, {"bucket", l.Bucket}} {
		if p.d <= 0 {
			errs = append(errs, fmt.Errorf("topics: --%s must be positive, as dedup's (got %s)", p.name, p.d))
		}
	}
	if int(l.ReplicationFactor) > brokers {
		errs = append(errs, fmt.Errorf("topics: --replication-factor %d needs %d brokers, the cluster has %d", l.ReplicationFactor, l.ReplicationFactor, brokers))
	}
	if l.MinInsyncReplicas > l.ReplicationFactor {
		errs = append(errs, fmt.Errorf("topics: --min-insync-replicas %d exceeds the replication factor %d: no acks=all write could succeed", l.MinInsyncReplicas, l.ReplicationFactor))
	}
	return l, errors.Join(errs...)
}

// Brokers are the brokers of a cluster: every one registered with it,
// and those of them that are down.
type Brokers struct {
	Registered int
	Down       []int32 // sorted
}

// String says how many brokers the cluster has and which are down:
// "3 brokers", "3 brokers (1 down: broker 2)".
func (b Brokers) String() string {
	if len(b.Down) == 0 {
		return fmt.Sprintf("%d brokers", b.Registered)
	}
	ids := make([]string, len(b.Down))
	for i, id := range b.Down {
		ids[i] = fmt.Sprint(id)
	}
	return fmt.Sprintf("%d brokers (%d down: broker %s)", b.Registered, len(b.Down), strings.Join(ids, ", "))
}

// ClusterBrokers returns the brokers registered with the cluster, live or
// not. A broker that is down (killed, paused, restarting) is still one of
// the cluster's: the replication chosen for it, and the topics' drift, must
// not change while it is away. Metadata lists only the live brokers; the
// controller's registrations (DescribeCluster v2 with its fenced brokers,
// Kafka 4.0 on) and the replicas of the cluster's partitions name the
// others; req (nil: none) sends the DescribeCluster.
func ClusterBrokers(ctx context.Context, adm *kadm.Client, req kmsg.Requestor) (Brokers, error) {
	m, err := adm.Metadata(ctx)
	if err != nil {
		return Brokers{}, fmt.Errorf("topics: broker metadata: %w", err)
	}
	live := make(map[int32]bool, len(m.Brokers))
	all := make(map[int32]bool, len(m.Brokers))
	for _, b := range m.Brokers {
		live[b.NodeID] = true
		all[b.NodeID] = true
	}
	for _, td := range m.Topics {
		for _, p := range td.Partitions {
			for _, r := range p.Replicas {
				all[r] = true
			}
		}
	}
	// Older brokers answer without the fenced ones, or not at all: the
	// metadata's brokers and replicas stand then.
	if req != nil {
		dc := kmsg.NewPtrDescribeClusterRequest()
		dc.IncludeFencedBrokers = true
		resp, err := dc.RequestWith(ctx, req)
		if err != nil || resp.ErrorCode != 0 {
			resp = &kmsg.DescribeClusterResponse{}
		}
		for _, b := range resp.Brokers {
			all[b.NodeID] = true
			if !b.IsFenced {
				live[b.NodeID] = true
			}
		}
	}
	out := Brokers{Registered: len(all)}
	for id := range all {
		if !live[id] {
			out.Down = append(out.Down, id)
		}
	}
	slices.Sort(out.Down)
	return out, nil
}

// BrokerCount returns how many brokers the cluster has, live or down
// (ClusterBrokers, from the metadata's brokers and replicas).
func BrokerCount(ctx context.Context, adm *kadm.Client) (int, error) {
	b, err := ClusterBrokers(ctx, adm, nil)
	return b.Registered, err
}

// Spec is one topic as Meterline needs it.
type Spec struct {
	Name       string
	Partitions int32
	// PartitionsOf names the topic whose partition count this one must
	// equal: a changelog's input topic, or the topic it is co-partitioned
	// with (CoPartitioned); empty for other topics.
	PartitionsOf  string
	CoPartitioned bool
	// Configs to set on creation. Retention in MinRetention is set too.
	Configs map[string]string
	// MinRetention is the least retention.ms the topic may have; 0 means
	// no requirement.
	MinRetention time.Duration
	// ReplicationFactor is the replication factor the topic must have; 0
	// leaves it to Create's argument and Check does not compare it.
	ReplicationFactor int16
}

// Specs returns every topic (docs/design.md, Topics) in a stable order. A
// layout's replication factor and min.insync.replicas > 0 go into every
// spec (Resolve decides them for a cluster); ≤ 0 leaves them to Create.
func Specs(n Names, l Layout) (specs []Spec) {
	ret := l.Window + l.RetentionMargin
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	del := func(minRet time.Duration, extra ...string) (map[string]string, time.Duration) {
		c := map[string]string{"cleanup.policy": "delete"}
		if minRet > 0 {
			c["retention.ms"] = ms(minRet)
		}
		for i := 0; i+1 < len(extra); i += 2 {
			c[extra[i]] = extra[i+1]
		}
		return c, minRet
	}
	spec := func(name string, c map[string]string, minRet time.Duration) Spec {
		return Spec{Name: name, Partitions: l.Partitions, Configs: c, MinRetention: minRet}
	}
	defer func() {
		// Replication, where the layout decides it (Layout.Resolve).
		for i := range specs {
			if l.ReplicationFactor > 0 {
				specs[i].ReplicationFactor = l.ReplicationFactor
			}
			if l.MinInsyncReplicas > 0 {
				specs[i].Configs["min.insync.replicas"] = strconv.Itoa(int(l.MinInsyncReplicas))
			}
		}
	}()
	eventsCfg, eventsRet := del(ret, "message.timestamp.type", l.EventsTimestamp)
	rejCfg, rejRet := del(ret)
	adjCfg, adjRet := del(ret)
	// The aggregator deciding entitlements bounds an event's ingest_time
	// and a watermark by their record's timestamp in the deduped topic
	// (docs/entitlements.md, The aggregator): a broker time, not dedup's clock.
	dedCfg, _ := del(0, "message.timestamp.type", l.EventsTimestamp)
	dupCfg, _ := del(0)
	// Dedup keeps a key until the watermark passes the end of its first
	// arrival's bucket + W + S: up to W + S + B after that arrival. The
	// changelog must hold the key that long, or a restore loses it while
	// dedup would still recognise a copy.
	clNeed := l.Window + l.Skew + l.Bucket
	clRet := clNeed + l.RetentionMargin
	specs = []Spec{
		spec(n.EventsTopic(), eventsCfg, eventsRet),
		spec(n.DedupedTopic(), dedCfg, 0),
		spec(n.DuplicatesTopic(), dupCfg, 0),
		spec(n.RejectedTopic(), rejCfg, rejRet),
		spec(n.AggregatesTopic(), map[string]string{"cleanup.policy": "compact"}, 0),
		spec(n.AdjustmentsTopic(), adjCfg, adjRet),
		{Name: n.DedupChangelogTopic(), Partitions: l.Partitions, PartitionsOf: n.EventsTopic(),
			Configs: map[string]string{"cleanup.policy": "compact,delete", "retention.ms": ms(clRet)}, MinRetention: clNeed},
		{Name: n.AggregateChangelogTopic(), Partitions: l.Partitions, PartitionsOf: n.DedupedTopic(),
			Configs: map[string]string{"cleanup.policy": "compact"}},
		// Entitlements are read by the aggregator in the transactions of
		// the deduped partition of the same number (docs/entitlements.md,
		// Topics), and their timestamps are arrivals. A stage that lags
		// must still read every record: compaction keeps each record,
		// tombstones included, for W plus the margin.
		{Name: n.EntitlementsTopic(), Partitions: l.Partitions, PartitionsOf: n.DedupedTopic(), CoPartitioned: true,
			Configs: map[string]string{"cleanup.policy": "compact", "message.timestamp.type": l.EventsTimestamp,
				"min.compaction.lag.ms": ms(ret), "delete.retention.ms": ms(ret)}},
		spec(n.BalancesTopic(), map[string]string{"cleanup.policy": "compact", "message.timestamp.type": l.EventsTimestamp}, 0),
		// One partition: a few records, read whole by every ingest replica.
		{Name: n.KeysTopic(), Partitions: 1, Configs: map[string]string{"cleanup.policy": "compact"}},
	}
	return specs
}

// Result is what Create did for one topic.
type Result struct {
	Name    string
	Created bool  // false: it already existed (and was left alone)
	Err     error // nil on success
}

// Create creates every topic that does not exist yet. Existing topics are
// left as they are; run Check to see whether they drifted. A spec's own
// ReplicationFactor wins over rf; rf ≤ 0 takes DefaultReplication for the
// cluster's broker count. A spec without min.insync.replicas gets
// DefaultMinInsync of its replication factor, so that no topic depends on
// the brokers' default.
func Create(ctx context.Context, adm *kadm.Client, specs []Spec, rf int16) ([]Result, error) {
	for i, s := range specs {
		if s.Name == "" {
			// A Names with a field left empty (a struct literal that
			// predates a new topic): the brokers would never show it.
			return nil, fmt.Errorf("topics: create: spec %d has no topic name", i)
		}
	}
	if rf <= 0 && slices.ContainsFunc(specs, func(s Spec) bool { return s.ReplicationFactor <= 0 }) {
		n, err := BrokerCount(ctx, adm)
		if err != nil {
			return nil, err
		}
		rf, _ = DefaultReplication(n)
	}
	var out []Result
	var errs []error
	for _, s := range specs {
		srf := rf
		if s.ReplicationFactor > 0 {
			srf = s.ReplicationFactor
		}
		cfg := make(map[string]*string, len(s.Configs)+1)
		for k, v := range s.Configs {
			cfg[k] = &v
		}
		if _, ok := cfg["min.insync.replicas"]; !ok {
			v := strconv.Itoa(int(DefaultMinInsync(srf)))
			cfg["min.insync.replicas"] = &v
		}
		resp, err := adm.CreateTopic(ctx, s.Partitions, srf, cfg, s.Name)
		if err == nil {
			err = resp.Err
		}
		switch {
		case err == nil:
			out = append(out, Result{Name: s.Name, Created: true})
		case errors.Is(err, kerr.TopicAlreadyExists):
			out = append(out, Result{Name: s.Name})
		default:
			err = fmt.Errorf("topics: create %s: %w", s.Name, aclNeeded("Create on topic "+s.Name, err))
			out = append(out, Result{Name: s.Name, Err: err})
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	// The controller has the topics; wait until the brokers' metadata
	// shows them too, so that a Check or a client right after sees them.
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return out, WaitVisible(ctx, adm, names...)
}

// Delete deletes the named topics. A topic already gone is no error: a
// deleted topic stays in a broker's metadata a moment after DeleteTopics
// returns, so a list read then still names it.
func Delete(ctx context.Context, adm *kadm.Client, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	resps, err := adm.DeleteTopics(ctx, names...)
	if err != nil {
		return fmt.Errorf("delete topics %v: %w", names, err)
	}
	var errs []error
	for _, r := range resps.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("delete topic %s: %w", r.Topic, r.Err))
		}
	}
	return errors.Join(errs...)
}

// WaitVisible waits until every named topic appears with all its
// partitions in the brokers' metadata, or ctx ends.
//
// Each look asks a broker. kadm answers metadata from the client's cache,
// for up to MetadataMinAge (5 s by default), so a topic seen missing once
// (a broker that had not published it yet) would stay missing that long;
// a metadata request for authorized operations is never served from that
// cache.
func WaitVisible(ctx context.Context, adm *kadm.Client, names ...string) error {
	for {
		details, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), names...)
		if err == nil {
			missing := ""
			for _, n := range names {
				if d, ok := details[n]; !ok || d.Err != nil || len(d.Partitions) == 0 {
					missing = n
					break
				}
			}
			if missing == "" {
				return nil
			}
			err = fmt.Errorf("%s not in metadata yet", missing)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics: waiting for metadata: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitVisibleEverywhere waits until every broker of the cluster answers
// metadata for every named topic with all its partitions, or ctx ends. On a
// cluster, a topic the controller created reaches each broker's metadata
// at its own pace; a stage started right after `topics create` may ask any
// of them, and stops on a topic it is told is missing.
func WaitVisibleEverywhere(ctx context.Context, cl *kgo.Client, names ...string) error {
	adm := kadm.NewClient(cl)
	for {
		err := visibleEverywhere(ctx, cl, adm, names)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics: waiting for every broker's metadata: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func visibleEverywhere(ctx context.Context, cl *kgo.Client, adm *kadm.Client, names []string) error {
	m, err := adm.BrokerMetadata(ctx)
	if err != nil {
		return err
	}
	for _, b := range m.Brokers {
		req := kmsg.NewPtrMetadataRequest()
		for _, n := range names {
			t := kmsg.NewMetadataRequestTopic()
			t.Topic = kmsg.StringPtr(n)
			req.Topics = append(req.Topics, t)
		}
		resp, err := req.RequestWith(ctx, cl.Broker(int(b.NodeID)))
		if err != nil {
			return fmt.Errorf("broker %d: %w", b.NodeID, err)
		}
		for _, t := range resp.Topics {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil || len(t.Partitions) == 0 {
				name := ""
				if t.Topic != nil {
					name = *t.Topic
				}
				return fmt.Errorf("broker %d does not have %s yet: %v", b.NodeID, name, err)
			}
		}
	}
	return nil
}

// Drift is one difference between a topic and its Spec.
type Drift struct {
	Topic string
	What  string // "missing", "partitions", "cleanup.policy", "retention.ms", ...
	Have  string
	Want  string
	// Set is the topic config that repairs a config's drift (k=v), empty
	// for the others: topics create leaves an existing topic as it is.
	Set string
}

func (d Drift) String() string {
	if d.What == "missing" {
		return d.Topic + ": missing"
	}
	s := fmt.Sprintf("%s: %s is %s, want %s", d.Topic, d.What, d.Have, d.Want)
	if d.Set != "" {
		s += fmt.Sprintf(" (set it: kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config %s)", d.Topic, d.Set)
	}
	return s
}

// configSet is k=v as kafka-configs.sh --add-config takes it: a list
// value in brackets.
func configSet(k, v string) string {
	if strings.Contains(v, ",") {
		v = "[" + v + "]"
	}
	return k + "=" + v
}

// aclNeeded wraps err, when it is the brokers' refusal of a topic
// request, with the ACL the request needs; else it returns err.
func aclNeeded(acl string, err error) error {
	if !errors.Is(err, kerr.TopicAuthorizationFailed) {
		return err
	}
	return fmt.Errorf("the principal needs %s (docs/operations.md, Security and ACLs): %w", acl, err)
}

// Check compares the cluster with the specs and returns every drift found:
// missing topics, partition counts, changelogs whose partition count differs
// from their input topic's and an entitlements topic whose count differs
// from the deduped topic's, cleanup policy, too short retention, the
// timestamp types and the compaction settings the specs set, the
// replication factor and min.insync.replicas where the specs set them, and
// partitions that are under-replicated (a replica out of the ISR) or have
// no leader.
func Check(ctx context.Context, adm *kadm.Client, specs []Spec) ([]Drift, error) {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	details, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("topics: list: %w", aclNeeded("Describe on topics "+strings.Join(names, ","), err))
	}
	var present []string
	for _, n := range names {
		if d, ok := details[n]; ok && d.Err == nil {
			present = append(present, n)
		}
	}
	configs := map[string]map[string]kadm.Config{}
	if len(present) > 0 {
		rcs, err := adm.DescribeTopicConfigs(ctx, present...)
		if err != nil {
			return nil, fmt.Errorf("topics: describe configs: %w", aclNeeded("DescribeConfigs on topics "+strings.Join(present, ","), err))
		}
		for _, rc := range rcs {
			if rc.Err != nil {
				return nil, fmt.Errorf("topics: describe configs of %s: %w", rc.Name, aclNeeded("DescribeConfigs on topic "+rc.Name, rc.Err))
			}
			m := map[string]kadm.Config{}
			for _, c := range rc.Configs {
				m[c.Key] = c
			}
			configs[rc.Name] = m
		}
	}
	var drifts []Drift
	for _, s := range specs {
		d, ok := details[s.Name]
		if !ok || d.Err != nil {
			drifts = append(drifts, Drift{Topic: s.Name, What: "missing"})
			continue
		}
		have := int32(len(d.Partitions))
		if s.PartitionsOf != "" {
			if in, ok := details[s.PartitionsOf]; ok && in.Err == nil && int32(len(in.Partitions)) != have {
				why := "as many as its input"
				if s.CoPartitioned {
					why = "co-partitioned with"
				}
				drifts = append(drifts, Drift{Topic: s.Name, What: "partitions",
					Have: fmt.Sprint(have), Want: fmt.Sprintf("%d (%s %s)", len(in.Partitions), why, s.PartitionsOf)})
			}
		} else if have != s.Partitions {
			drifts = append(drifts, Drift{Topic: s.Name, What: "partitions", Have: fmt.Sprint(have), Want: fmt.Sprint(s.Partitions)})
		}
		drifts = append(drifts, replicationDrifts(s.Name, s.ReplicationFactor, d.Partitions)...)
		cfg := configs[s.Name]
		keys := make([]string, 0, len(s.Configs))
		for k := range s.Configs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "retention.ms" {
				continue // checked as a minimum below
			}
			if got := cfgValue(cfg, k); !sameConfig(k, got, s.Configs[k]) {
				drifts = append(drifts, Drift{Topic: s.Name, What: k, Have: got, Want: s.Configs[k], Set: configSet(k, s.Configs[k])})
			}
		}
		if s.MinRetention > 0 {
			got := cfgValue(cfg, "retention.ms")
			ms, err := strconv.ParseInt(got, 10, 64)
			if err != nil || (ms >= 0 && time.Duration(ms)*time.Millisecond < s.MinRetention) {
				set := s.Configs["retention.ms"]
				if set == "" {
					set = strconv.FormatInt(s.MinRetention.Milliseconds(), 10)
				}
				drifts = append(drifts, Drift{Topic: s.Name, What: "retention.ms", Have: human(got),
					Want: "at least " + human(strconv.FormatInt(s.MinRetention.Milliseconds(), 10)), Set: configSet("retention.ms", set)})
			}
		}
	}
	return drifts, nil
}

func cfgValue(cfg map[string]kadm.Config, k string) string {
	c, ok := cfg[k]
	if !ok || c.Value == nil {
		return "(unset)"
	}
	return *c.Value
}

// sameConfig compares config values, treating cleanup.policy as a set.
func sameConfig(k, have, want string) bool {
	if k != "cleanup.policy" {
		return have == want
	}
	return normPolicy(have) == normPolicy(want)
}

func normPolicy(p string) string {
	parts := strings.Split(p, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func human(ms string) string {
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return ms
	}
	if v < 0 {
		return ms + " (infinite)"
	}
	d := time.Duration(v) * time.Millisecond
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%s (%dd)", ms, d/(24*time.Hour))
	}
	return fmt.Sprintf("%s (%s)", ms, d)
}

// replicationDrifts reports a topic whose partitions do not all have rf
// replicas (rf > 0), and its partitions with a replica out of sync or no
// leader at all.
func replicationDrifts(topic string, rf int16, parts kadm.PartitionDetails) []Drift {
	var out []Drift
	var lo, hi int
	var under, offline []string
	for i, p := range parts.Sorted() {
		n := len(p.Replicas)
		if i == 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
		switch {
		case p.Leader < 0:
			offline = append(offline, fmt.Sprintf("%d (replicas %v, in sync %v)", p.Partition, p.Replicas, p.ISR))
		case len(p.ISR) < n:
			under = append(under, fmt.Sprintf("%d (in sync %v of %v)", p.Partition, p.ISR, p.Replicas))
		}
	}
	if rf > 0 && len(parts) > 0 && (lo != int(rf) || hi != int(rf)) {
		have := fmt.Sprint(lo)
		if lo != hi {
			have = fmt.Sprintf("%d to %d", lo, hi)
		}
		out = append(out, Drift{Topic: topic, What: "replication factor", Have: have, Want: fmt.Sprint(rf)})
	}
	if len(offline) > 0 {
		out = append(out, Drift{Topic: topic, What: "partitions without a leader", Have: strings.Join(offline, ", "), Want: "none"})
	}
	if len(under) > 0 {
		out = append(out, Drift{Topic: topic, What: "under-replicated partitions", Have: strings.Join(under, ", "), Want: "none"})
	}
	return out
}

// Kafka's internal topics that the pipeline's exactly-once depends on:
// consumer group offsets and transaction state.
var internalTopics = []string{"__consumer_offsets", "__transaction_state"}

// CheckInternal reports Kafka's internal topics (group offsets, transaction
// state) with fewer than rf replicas, or with under-replicated or leaderless
// partitions: losing one broker must not lose a group coordinator or a
// transaction coordinator (docs/operations.md, Replication). A topic the
// brokers have not created yet (it appears with the first group or
// transactional producer) is skipped.
//
// A principal that may not describe them (the operator of
// docs/operations.md holds no ACL on Kafka's internal topics) gets
// ErrInternalNotAuthorized with the drifts of those it could read.
func CheckInternal(ctx context.Context, adm *kadm.Client, rf int16) ([]Drift, error) {
	details, err := adm.ListTopicsWithInternal(ctx, internalTopics...)
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return nil, ErrInternalNotAuthorized
	}
	if err != nil {
		return nil, fmt.Errorf("topics: list internal topics: %w", err)
	}
	var drifts []Drift
	var refused bool
	for _, name := range internalTopics {
		d, ok := details[name]
		if ok && errors.Is(d.Err, kerr.TopicAuthorizationFailed) {
			refused = true
		}
		if !ok || d.Err != nil {
			continue
		}
		drifts = append(drifts, replicationDrifts(name, 0, d.Partitions)...)
		var lo int
		for i, p := range d.Partitions.Sorted() {
			if i == 0 || len(p.Replicas) < lo {
				lo = len(p.Replicas)
			}
		}
		if len(d.Partitions) > 0 && lo < int(rf) {
			drifts = append(drifts, Drift{Topic: name, What: "replication factor", Have: fmt.Sprint(lo),
				Want: fmt.Sprintf("at least %d (the brokers' offsets.topic.replication.factor and transaction.state.log.replication.factor)", rf)})
		}
	}
	if refused {
		return drifts, ErrInternalNotAuthorized
	}
	return drifts, nil
}

// ErrInternalNotAuthorized: the principal may not describe Kafka's
// internal topics, so CheckInternal could not check them all.
var ErrInternalNotAuthorized = errors.New("topics: not authorized to describe __consumer_offsets and __transaction_state (grant Describe on them to check their replication)")
