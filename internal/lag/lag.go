// Package lag computes consumer lag per group and partition, as records
// behind and seconds behind, the way an SRE reads it for Meterline's
// transactional stages.
//
// Committed offsets are not simply compared with end offsets: transaction
// markers sit after the last record, so a caught-up exactly-once group
// would show a lag of one per partition forever. A partition is behind only
// when a read_committed fetch from its committed offset returns a record
// (docs/operations.md, Lag); its lag is then the last stable offset minus
// the committed offset, and its age is wall time minus that first
// unconsumed record's broker timestamp.
package lag

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
)

// Row is the lag of one group on one partition.
type Row struct {
	Group     string
	Topic     string
	Partition int32
	Committed int64 // -1: the group has no committed offset
	End       int64 // last stable offset (read_committed end)
	Records   int64 // 0 when caught up
	Behind    time.Duration
	// High is the partition's high watermark (read_uncommitted end),
	// listed before End: High - End records sit past the last stable
	// offset, held from a read_committed consumer by a transaction open
	// there (Held).
	High int64
}

// Held returns how many records sit past the last stable offset (the
// high watermark minus it, transaction markers included): records no
// read_committed consumer gets until the transaction open at the last
// stable offset ends. 0 when none.
func (r Row) Held() int64 { return max(r.High-r.End, 0) }

// Compute returns the lag of each group on every partition of the topics
// it has committed offsets for, sorted by group, topic and partition. A
// group with no committed offsets yields no rows.
func Compute(ctx context.Context, conn kafka.Config, groups []string, now time.Time) ([]Row, error) {
	cl, err := kafka.NewListedClient(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return computeWith(ctx, cl, conn, groups, nil, now, true)
}

// computeWith is Compute on an existing client. inputs names, per
// group, topics it consumes: a partition of one of them without a
// committed offset counts from the partition's start, where the stage's
// first start reads (docs/design.md, Exactly-once, 6), even when the group
// has committed nothing at all. waitDial: fetchOffsets waits out a
// coordinator out of reach (a one-shot command may take its time; a
// scrape must answer within Prometheus's scrape timeout, and fails at once
// instead).
func computeWith(ctx context.Context, cl *kgo.Client, conn kafka.Config, groups []string, inputs map[string][]string, now time.Time, waitDial bool) ([]Row, error) {
	adm := kadm.NewClient(cl)
	var rows []Row
	var read *kafka.Config // conn seeded with the brokers the cluster lists; set once needed
	for _, g := range groups {
		byTopic := map[string]map[int32]int64{}
		offs, err := fetchOffsets(ctx, cl, g, waitDial)
		switch {
		case errors.Is(err, kerr.GroupIDNotFound): // never committed
		case errors.Is(err, kerr.GroupAuthorizationFailed):
			return nil, fmt.Errorf("lag: offsets of group %s: %w", g, needs(conn, "Describe on group "+g, err))
		case err != nil:
			return nil, fmt.Errorf("lag: offsets of group %s: %w", g, err)
		default:
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Err != nil {
					return
				}
				if byTopic[o.Topic] == nil {
					byTopic[o.Topic] = map[int32]int64{}
				}
				byTopic[o.Topic][o.Partition] = o.At
			})
		}
		for _, t := range inputs[g] {
			if byTopic[t] == nil {
				byTopic[t] = map[int32]int64{}
			}
		}
		for topic, committed := range byTopic {
			// The high watermark before the last stable offset: a record
			// produced between the two requests never counts as held.
			highs, err := adm.ListEndOffsets(ctx, topic) // read_uncommitted end = high watermark
			if err != nil {
				return nil, fmt.Errorf("lag: high watermarks of %s: %w", topic, describeNeeded(conn, topic, err))
			}
			ends, err := adm.ListCommittedOffsets(ctx, topic) // read_committed end = LSO
			if err != nil {
				return nil, fmt.Errorf("lag: end offsets of %s: %w", topic, describeNeeded(conn, topic, err))
			}
			// A partition whose end is unknown (a topic that does not
			// exist yet, a leader moving) has no row this time.
			for p, e := range ends[topic] {
				if e.Err != nil {
					delete(ends[topic], p)
				}
			}
			// Where the group reads next: its committed offset, or the
			// partition's start.
			from := map[int32]int64{}
			var starts kadm.ListedOffsets
			if len(committed) < len(ends[topic]) {
				if starts, err = adm.ListStartOffsets(ctx, topic); err != nil {
					return nil, fmt.Errorf("lag: start offsets of %s: %w", topic, describeNeeded(conn, topic, err))
				}
			}
			ends.Each(func(e kadm.ListedOffset) {
				if c, ok := committed[e.Partition]; ok {
					from[e.Partition] = c
				} else if s, ok := starts.Lookup(topic, e.Partition); ok && s.Err == nil {
					from[e.Partition] = s.Offset
				}
			})
			if read == nil {
				c := listedBrokers(ctx, cl, conn)
				read = &c
			}
			first, err := firstUnconsumed(ctx, *read, topic, from, ends)
			if err != nil {
				return nil, err
			}
			ends.Each(func(e kadm.ListedOffset) {
				r := Row{Group: g, Topic: topic, Partition: e.Partition, Committed: -1, End: e.Offset, High: e.Offset}
				if h, ok := highs.Lookup(topic, e.Partition); ok && h.Err == nil {
					r.High = h.Offset
				}
				if c, ok := committed[e.Partition]; ok {
					r.Committed = c
				}
				if ts, ok := first[e.Partition]; ok {
					r.Records = e.Offset - from[e.Partition]
					if r.Records < 1 {
						r.Records = 1
					}
					r.Behind = now.Sub(ts)
					if r.Behind < 0 {
						r.Behind = 0
					}
				}
				rows = append(rows, r)
			})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
	return rows, nil
}

// listedBrokers returns conn with the brokers the cluster's metadata
// lists now as its seeds, asked of the brokers cl has discovered and of
// its seeds, all at once (kafka.ListedBrokers), or conn unchanged when
// none answers. firstUnconsumed's client is new at each computation, as
// Compute's is, and would otherwise start from the seeds: one of them
// paused or cut off (the cluster fenced it and runs on) makes a first
// request wait for the request timeout (10 s) whenever it picks that
// seed, longer than a computation's bound, and the lag of every group
// goes missing while one broker is down.
func listedBrokers(ctx context.Context, cl *kgo.Client, conn kafka.Config) kafka.Config {
	brokers, _ := kafka.ListedBrokers(ctx, slices.Concat(cl.DiscoveredBrokers(), cl.SeedBrokers()), kafka.ListedBrokerWait)
	if len(brokers) == 0 {
		return conn
	}
	out := conn
	out.Brokers = brokers
	return out
}

// firstUnconsumed returns, per partition with data after the offset the
// group reads next (committed; absent: offset 0), the broker timestamp of
// the first record a read_committed consumer would get there.
//
// It sends its own read_committed fetches to the partitions' leaders and
// follows the offset each response leads to, aborted records and
// transaction markers included: a partition whose only records before
// the last stable offset are an aborted transaction's (its abort marker
// written after another producer opened a transaction there) yields no
// record, and a consumer's fetch would only wait at the last stable
// offset, which it cannot tell from a fetch of records it filters out.
func firstUnconsumed(ctx context.Context, conn kafka.Config, topic string, committed map[int32]int64, ends kadm.ListedOffsets) (map[int32]time.Time, error) {
	at := map[int32]int64{} // next offset to read, per partition still open
	want := map[int32]int64{}
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if c, ok := committed[e.Partition]; ok {
			from = c
		}
		if e.Offset > from {
			at[e.Partition] = from
			want[e.Partition] = e.Offset
		}
	})
	out := map[int32]time.Time{}
	if len(at) == 0 {
		return out, nil
	}
	cl, err := kafka.NewClient(conn)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	var lastErr error
	for len(at) > 0 {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("lag: reading %s: %w (last error: %v)", topic, ctx.Err(), lastErr)
		}
		if lastErr != nil {
			time.Sleep(100 * time.Millisecond)
		}
		lastErr = nil
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			lastErr = err
			continue
		}
		td := md.Topics[topic]
		byLeader := map[int32][]int32{}
		for p := range at {
			pd, ok := td.Partitions[p]
			if !ok || pd.Err != nil || pd.Leader < 0 {
				lastErr = fmt.Errorf("partition %d has no leader", p)
				continue
			}
			byLeader[pd.Leader] = append(byLeader[pd.Leader], p)
		}
		var outOfRange []int32
		for leader, parts := range byLeader {
			// One partition a fetch: the broker returns at least a
			// whole batch of the first partition with data only, and a
			// later one's batch larger than its share comes back cut,
			// which reads as nothing to read.
			for _, p := range parts {
				oor, err := fetchFirst(ctx, cl.Broker(int(leader)), topic, td.ID, []int32{p}, at, want, out)
				if errors.Is(err, kerr.TopicAuthorizationFailed) {
					// No retry grants the ACL: fail now, not at the deadline.
					return nil, fmt.Errorf("lag: reading %s: %w", topic,
						needs(conn, "Read on topic "+topic+" (to read the age of the first record a group has not consumed)", err))
				}
				if err != nil {
					lastErr = err
				}
				outOfRange = append(outOfRange, oor...)
			}
		}
		if len(outOfRange) > 0 { // deleted by retention: read from the start, as the stage does
			starts, err := adm.ListStartOffsets(ctx, topic)
			if err != nil {
				lastErr = err
				continue
			}
			for _, p := range outOfRange {
				if s, ok := starts.Lookup(topic, p); ok && s.Err == nil && s.Offset > at[p] {
					at[p] = s.Offset
				}
			}
		}
	}
	return out, nil
}

// fetchFirst sends one read_committed fetch of parts, from at, to broker b
// and moves each partition on: a partition leaves at once it has a record
// before its end in want (recorded in out), or when it has nothing more
// to read before its end. It returns the partitions whose offset is out
// of range.
func fetchFirst(ctx context.Context, b *kgo.Broker, topic string, id kadm.TopicID, parts []int32, at, want map[int32]int64, out map[int32]time.Time) (outOfRange []int32, err error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 1
	req.MaxBytes = 1 << 20
	req.IsolationLevel = 1
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, id
	for _, p := range parts {
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, at[p], 64<<10
		rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := b.Request(ctx, req)
	if err != nil {
		return nil, err
	}
	fr := resp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(fr.ErrorCode); err != nil {
		return nil, err
	}
	var failed error
	for i := range fr.Topics {
		for j := range fr.Topics[i].Partitions {
			rp := &fr.Topics[i].Partitions[j]
			p := rp.Partition
			from, ok := at[p]
			if !ok {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				if errors.Is(err, kerr.OffsetOutOfRange) {
					outOfRange = append(outOfRange, p)
				}
				failed = fmt.Errorf("partition %d: %w", p, err)
				continue
			}
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: from, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: p,
			}, rp, kgo.DefaultDecompressor(), nil)
			if fp.Err != nil {
				failed = fmt.Errorf("partition %d: %w", p, fp.Err)
				continue
			}
			if len(fp.Records) > 0 && fp.Records[0].Offset < want[p] {
				out[p] = fp.Records[0].Timestamp
			}
			// Done with a record, at the end, or with nothing to read
			// (the last stable offset reached).
			if len(fp.Records) > 0 || next >= want[p] || next <= from {
				delete(at, p)
				continue
			}
			at[p] = next
		}
	}
	return outOfRange, failed
}

// needs wraps err, a request of conn's principal refused for want of an
// ACL, with the ACL it lacks.
func needs(conn kafka.Config, acl string, err error) error {
	return fmt.Errorf("%s needs %s (docs/operations.md, Security and ACLs): %w", conn.Principal(), acl, err)
}

// describeNeeded is needs of Describe on topic when err is the brokers'
// refusal of the topic, else err.
func describeNeeded(conn kafka.Config, topic string, err error) error {
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return needs(conn, "Describe on topic "+topic, err)
	}
	return err
}

// brokerErr reports a connection to a broker that could not be made, or
// failed, or a coordinator named that is no broker the client lists: all
// of them what a broker that just died leaves until the cluster fences it
// and moves its groups.
func brokerErr(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || kgo.IsRetryableBrokerErr(err)
}

// coordinatorWait bounds how long fetchOffsets waits for a group
// coordinator that is not available yet.
var coordinatorWait = 30 * time.Second

// fetchOffsets is FetchOffsets of group g, waiting up to coordinatorWait
// (and ctx) while the group's coordinator is not available: a broker that
// has never served a consumer group answers so for the few seconds it
// takes to create __consumer_offsets, and a coordinator moving to another
// broker for a moment. A connection to the coordinator that cannot be
// made (its broker just died: the cluster names it until it is fenced),
// or a coordinator no listed broker is (brokerErr), is waited out the
// same way with waitDial: the client keeps the coordinator it found
// while its broker is listed, so the brokers are listed again before each
// retry, and once the dead one is gone the coordinator is found anew.
func fetchOffsets(ctx context.Context, cl *kgo.Client, g string, waitDial bool) (kadm.OffsetResponses, error) {
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(coordinatorWait)
	backoff := 100 * time.Millisecond
	for {
		offs, err := adm.FetchOffsets(ctx, g)
		dial := waitDial && ctx.Err() == nil && brokerErr(err)
		if !dial && !errors.Is(err, kerr.CoordinatorNotAvailable) && !errors.Is(err, kerr.CoordinatorLoadInProgress) && !errors.Is(err, kerr.NotCoordinator) {
			return offs, err
		}
		if time.Now().Add(backoff).After(deadline) {
			if dial {
				return nil, fmt.Errorf("the group's coordinator out of reach for %s (its broker down, or not listed by the cluster): %w", coordinatorWait, err)
			}
			return nil, fmt.Errorf("no coordinator for the group after %s (a broker that has never served a consumer group creates __consumer_offsets first, which takes seconds; else the brokers cannot place it): %w", coordinatorWait, err)
		}
		if dial {
			// A metadata request issued through the client replaces its
			// brokers with those listed (kadm's are answered from its
			// cache); its error is the next try's.
			req := kmsg.NewPtrMetadataRequest()
			req.Topics = []kmsg.MetadataRequestTopic{}
			_, _ = req.RequestWith(ctx, cl)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (waiting for the group's coordinator: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
