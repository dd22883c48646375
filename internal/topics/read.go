package topics

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
)

// ReadCommitted reads the topic's committed data records, read_committed,
// from the given offsets (nil: from the start of each partition) up to the
// high watermarks read when it is called. A transaction still open below
// them holds the read until it ends or ctx does. Transaction markers are
// read too (not returned), so the end of each partition is recognised
// exactly even when its last offsets are markers.
func ReadCommitted(ctx context.Context, brokers []string, topic string, from map[int32]int64) ([]*kgo.Record, error) {
	return ReadCommittedAs(ctx, kafka.Config{Brokers: brokers}, topic, from)
}

// ReadCommittedAs is ReadCommitted connected as conn says (SASL, TLS).
func ReadCommittedAs(ctx context.Context, conn kafka.Config, topic string, from map[int32]int64) ([]*kgo.Record, error) {
	var out []*kgo.Record
	if err := ScanCommittedAs(ctx, conn, topic, from, func(r *kgo.Record) { out = append(out, r) }); err != nil {
		return nil, err
	}
	return out, nil
}

// ScanCommittedAs reads what ReadCommittedAs returns, handing each record
// to fn as it is read instead of keeping it, so that its memory is the
// client's fetch buffers and what fn keeps, however many records it reads.
// A record fn keeps, or a slice of one, holds its fetch's buffer. fn is
// called from one goroutine, each partition's records in offset order.
func ScanCommittedAs(ctx context.Context, conn kafka.Config, topic string, from map[int32]int64, fn func(*kgo.Record)) error {
	return scanCommitted(ctx, conn, topic, from, false, fn)
}

// ScanCommittedMarkersAs is ScanCommittedAs handing fn the transaction
// markers below the end too (r.Attrs.IsControl(); the key says commit or
// abort: kmsg.ControlRecordKey), each in its place among the records: a
// reader can tell where each transaction it read ends, and that the
// records after the last marker belong to one that may go on past the end.
func ScanCommittedMarkersAs(ctx context.Context, conn kafka.Config, topic string, from map[int32]int64, fn func(*kgo.Record)) error {
	return scanCommitted(ctx, conn, topic, from, true, fn)
}

func scanCommitted(ctx context.Context, conn kafka.Config, topic string, from map[int32]int64, markers bool, fn func(*kgo.Record)) error {
	acl, err := kafka.NewClient(conn)
	if err != nil {
		return err
	}
	defer acl.Close()
	ends, err := kadm.NewClient(acl).ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("end offsets: %w", err)
	}
	want := map[int32]int64{}
	start := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		f := int64(0)
		if from != nil {
			f = from[o.Partition]
		}
		if o.Offset > f {
			want[o.Partition] = o.Offset
			start[o.Partition] = kgo.NewOffset().At(f)
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl, err := kafka.NewClient(conn,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return err
	}
	defer cl.Close()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w (still waiting on partitions→end %v)", err, want)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = fmt.Errorf("fetch %s/%d: %w", topic, p, err) })
		if ferr != nil {
			return ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok {
				return
			}
			if r.Offset >= end {
				// Everything below end was read: a transaction open when
				// end was read and aborted since has no records we can
				// see below end, and its marker at or past end.
				delete(want, r.Partition)
				return
			}
			if markers || !r.Attrs.IsControl() {
				fn(r)
			}
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	return nil
}

// PartitionCounts returns the partition count of each named topic, or an
// error naming the first topic that is missing.
func PartitionCounts(ctx context.Context, conn kafka.Config, names ...string) (map[string]int32, error) {
	// The request is sent as is rather than through kadm, whose error for a
	// topic the principal may not describe names no topic.
	resp, err := metadata(ctx, conn, false, names)
	if err != nil {
		return nil, err
	}
	got := make(map[string]kmsg.MetadataResponseTopic, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil {
			got[*t.Topic] = t
		}
	}
	var refused []string
	for _, name := range names {
		if t, ok := got[name]; ok && t.ErrorCode == kerr.TopicAuthorizationFailed.Code {
			refused = append(refused, name)
		}
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("read topic metadata: %s may not describe %s (grant it the ACLs of docs/operations.md, Security and ACLs: Read or Write on a topic implies Describe): %w",
			principal(conn), strings.Join(refused, ", "), kerr.TopicAuthorizationFailed)
	}
	n := make(map[string]int32, len(names))
	for _, name := range names {
		t, ok := got[name]
		if !ok || t.ErrorCode != 0 {
			return nil, fmt.Errorf("topic %s is missing (run meterline topics create): %v", name, kerr.ErrorForCode(t.ErrorCode))
		}
		n[name] = int32(len(t.Partitions))
	}
	return n, nil
}

// MayWrite returns an error naming the topics of names that conn's
// principal may not write (no Write ACL), or nil. It asks the brokers for
// the operations the principal is allowed on each topic; a topic that does
// not exist, or brokers that do not report the operations, pass: the
// writes themselves then fail or wait as they would.
func MayWrite(ctx context.Context, conn kafka.Config, names ...string) error {
	resp, err := metadata(ctx, conn, true, names)
	if err != nil {
		return err
	}
	var refused []string
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		switch {
		case t.ErrorCode == kerr.TopicAuthorizationFailed.Code:
			refused = append(refused, *t.Topic)
		case t.ErrorCode != 0 || t.AuthorizedOperations == math.MinInt32:
			// Missing, or operations not reported.
		case !slices.Contains(kadm.DecodeACLOperations(t.AuthorizedOperations), kmsg.ACLOperationWrite):
			refused = append(refused, *t.Topic)
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("%s may not write %s (it needs Write on topic %s: docs/operations.md, Security and ACLs): %w",
			principal(conn), strings.Join(refused, ", "), strings.Join(refused, ", topic "), kerr.TopicAuthorizationFailed)
	}
	return nil
}

// metadata asks the brokers for the metadata of the named topics, with
// the operations the principal is allowed on each when authOps, with a
// client seeded with the brokers the cluster lists
// (kafka.NewListedClient): a stage's checks at start do not wait on a
// seed broker that does not answer.
func metadata(ctx context.Context, conn kafka.Config, authOps bool, names []string) (*kmsg.MetadataResponse, error) {
	cl, err := kafka.NewListedClient(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	req.IncludeTopicAuthorizedOperations = authOps
	for _, name := range names {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("read topic metadata: %w", err)
	}
	return resp, nil
}

// principal names the principal conn authenticates as, for an error.
func principal(conn kafka.Config) string { return conn.Principal() }

// ConfigValue returns the value the brokers report for config key of
// topic: the topic's own, or the default it inherits. A config the brokers
// do not report, or one without a value (a sensitive one), is an error.
func ConfigValue(ctx context.Context, adm *kadm.Client, topic, key string) (string, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return "", err
	}
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return "", err
	}
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value, nil
		}
	}
	return "", fmt.Errorf("the brokers reported no %s for topic %s", key, topic)
}
