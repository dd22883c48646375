package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The changelog's offsets, fenced by the partition's leader epoch (KIP-320).
//
// A broker that was paused (SIGSTOP, a long GC or VM pause) loses the
// leadership of its partitions while it is away. Resumed, it still
// believes it leads them until it has caught up with the cluster's
// metadata, and until then it answers a ListOffsets with its own high
// watermark and last stable offset, behind the log's: a listing without a
// leader epoch (kadm's, CurrentLeaderEpoch -1) takes that answer. A
// restore that planned from it either stopped the stage ("checkpoint
// beyond changelog end") or, worse, replayed only up to the stale end and
// missed the records past it; the input-offset check catches that only
// when a missed transaction consumed input, not one of a Worker's chunks
// or a punctuation.
//
// So the runtime lists a changelog partition's offsets with its current
// leader epoch: the highest that the brokers report (the new leader knows
// its epoch; the stale broker, asked alone, would report its own), sent to
// the leader named with that epoch. A broker
// behind that epoch answers UNKNOWN_LEADER_EPOCH, one ahead of it
// FENCED_LEADER_EPOCH, one that no longer leads NOT_LEADER_OR_FOLLOWER: all
// retriable, and changelogOffset lists again, from fresh metadata.

// offsetQuery is what a listing asks of a partition: ListOffsets'
// isolation level and timestamp.
type offsetQuery struct {
	isolation int8
	timestamp int64
}

var (
	listEnd        = offsetQuery{isolation: 0, timestamp: -1} // the high watermark
	listLastStable = offsetQuery{isolation: 1, timestamp: -1} // read_committed's end
	listStart      = offsetQuery{isolation: 0, timestamp: -2} // the log start
)

// replicaMetadataWait bounds how long a listing waits for the brokers'
// metadata: a broker that is paused answers nothing, and the others'
// answers are enough.
const replicaMetadataWait = 2 * time.Second

// changelogLister returns a listing of q's offset of changelog partition p
// on cl, fenced by p's leader epoch, for changelogOffset.
func (rt *Runtime) changelogLister(cl *kgo.Client, p int32, q offsetQuery) func(context.Context) (kadm.ListedOffsets, error) {
	return func(ctx context.Context) (kadm.ListedOffsets, error) {
		return listFenced(ctx, cl, rt.cfg.ChangelogTopic, []int32{p}, q)
	}
}

// partitionLeader is a partition's leader and leader epoch, the highest
// epoch its replicas report, or the error that it has none.
type partitionLeader struct {
	leader, epoch int32
	err           error
}

// listFenced lists q's offset of topic's partitions ps, each sent to its
// leader with its current leader epoch (currentLeaders). It answers as
// kadm does: a partition missing from the topic's metadata is missing
// from the answer; a partition error is the ListedOffset's Err; a request
// that failed (a broker that did not answer) is the error, its partitions
// missing; an authorization failure is a *kadm.AuthError.
func listFenced(ctx context.Context, cl *kgo.Client, topic string, ps []int32, q offsetQuery) (kadm.ListedOffsets, error) {
	out := kadm.ListedOffsets{}
	err := listFencedEach(ctx, cl, topic, ps, q, func(o kadm.ListedOffset) {
		if out[topic] == nil {
			out[topic] = map[int32]kadm.ListedOffset{}
		}
		out[topic][o.Partition] = o
	})
	if errors.As(err, new(*kadm.AuthError)) {
		return nil, err
	}
	return out, err
}

// listFencedEach is listFenced, each partition's answer passed to each as
// soon as its leader's answer arrives (the leaders are asked at once, so
// that one that does not answer holds back only its own partitions): a
// partition whose metadata names no leader at once, with its error. Calls
// of each do not overlap; none follows listFencedEach's return. A
// partition missing from every answer is not passed on. The error is an
// authorization failure (*kadm.AuthError) if any, else the first request's
// that failed.
func listFencedEach(ctx context.Context, cl *kgo.Client, topic string, ps []int32, q offsetQuery, each func(kadm.ListedOffset)) error {
	leaders, err := currentLeaders(ctx, cl, topic, ps)
	if err != nil {
		return err
	}
	byLeader := map[int32][]kmsg.ListOffsetsRequestTopicPartition{}
	for _, p := range ps {
		l, ok := leaders[p]
		switch {
		case !ok:
		case l.err != nil:
			each(kadm.ListedOffset{Topic: topic, Partition: p, Offset: -1, LeaderEpoch: -1, Err: l.err})
		default:
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.CurrentLeaderEpoch, rp.Timestamp = p, l.epoch, q.timestamp
			byLeader[l.leader] = append(byLeader[l.leader], rp)
		}
	}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
		authErr  error
	)
	for leader, rps := range byLeader {
		req := kmsg.NewPtrListOffsetsRequest()
		req.ReplicaID = -1
		req.IsolationLevel = q.isolation
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic, rt.Partitions = topic, rps
		req.Topics = append(req.Topics, rt)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := req.RequestWith(ctx, cl.Broker(int(leader)))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			for _, t := range resp.Topics {
				if t.Topic != topic {
					continue
				}
				for _, rp := range t.Partitions {
					err := kerr.ErrorForCode(rp.ErrorCode)
					if isAuthErr(err) && authErr == nil {
						authErr = &kadm.AuthError{Err: err}
					}
					each(kadm.ListedOffset{Topic: topic, Partition: rp.Partition, Offset: rp.Offset, LeaderEpoch: rp.LeaderEpoch, Err: err})
				}
			}
		}()
	}
	wg.Wait()
	if authErr != nil {
		return authErr
	}
	return firstErr
}

func isAuthErr(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// currentLeaders returns the leader and current leader epoch of topic's
// partitions ps: every broker the client knows is asked the topic's
// metadata at once, and the answers that come within replicaMetadataWait
// count (a paused broker answers nothing; asking any one broker alone, the
// listing would wait for its request timeout when it is that one); a
// partition's leader is the one named with the highest epoch any of them
// reports, and it has none (an error) when none is named at that epoch. A
// partition no answer has is missing from the result; no
// answer at all is an error.
func currentLeaders(ctx context.Context, cl *kgo.Client, topic string, ps []int32) (map[int32]partitionLeader, error) {
	want := map[int32]bool{}
	for _, p := range ps {
		want[p] = true
	}
	leaders := map[int32]partitionLeader{}
	bs := cl.DiscoveredBrokers()
	if len(bs) == 0 { // a new client: the brokers come with a first answer
		first, err := topicMetadata(topic).RequestWith(ctx, cl)
		if err != nil {
			return nil, err
		}
		if _, err := mergeLeaders(leaders, first, topic, want); err != nil {
			return nil, err
		}
		bs = cl.DiscoveredBrokers()
	}

	wctx, cancel := context.WithTimeout(ctx, replicaMetadataWait)
	defer cancel()
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		answered int
		authErr  error
		lastErr  error
	)
	for _, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := topicMetadata(topic).RequestWith(wctx, b)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				lastErr = err // paused, dead or gone: the others answer
				return
			}
			answered++
			if _, err := mergeLeaders(leaders, resp, topic, want); err != nil {
				authErr = err
			}
		}()
	}
	wg.Wait()
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case authErr != nil:
		return nil, authErr
	case answered == 0 && len(leaders) == 0:
		return nil, fmt.Errorf("no broker answered the metadata of %s: %w", topic, lastErr)
	}
	return leaders, nil
}

// topicMetadata returns a request for topic's metadata (one for each
// request: the client sets the version on it).
func topicMetadata(topic string) *kmsg.MetadataRequest {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	return req
}

// mergeLeaders merges one broker's metadata of topic into leaders: for
// each partition in want, what the highest epoch so far names, the leader
// or, when no broker named one at that epoch, the error that it has none
// (a broker that reports the partition leaderless at a later epoch than
// another names itself, say a resumed one behind the cluster, is right:
// the one named at the old epoch may still answer at it, stale). found
// reports whether the topic was in the answer; an authorization failure is
// a *kadm.AuthError.
func mergeLeaders(leaders map[int32]partitionLeader, resp *kmsg.MetadataResponse, topic string, want map[int32]bool) (found bool, err error) {
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			if isAuthErr(err) {
				return false, &kadm.AuthError{Err: err}
			}
			return false, nil // unknown yet: missing partitions
		}
		found = true
		for _, pt := range t.Partitions {
			if !want[pt.Partition] {
				continue
			}
			l := partitionLeader{leader: pt.Leader, epoch: pt.LeaderEpoch, err: kerr.ErrorForCode(pt.ErrorCode)}
			if l.leader >= 0 && errors.Is(l.err, kerr.ReplicaNotAvailable) {
				// A follower is offline; the leader it names serves
				// ListOffsets all the same.
				l.err = nil
			}
			if l.err == nil && l.leader < 0 {
				l.err = kerr.LeaderNotAvailable
			}
			was, ok := leaders[pt.Partition]
			switch {
			case !ok, l.epoch > was.epoch:
				leaders[pt.Partition] = l
			case l.epoch == was.epoch && was.err != nil && l.err == nil:
				leaders[pt.Partition] = l
			}
		}
	}
	return found, nil
}
