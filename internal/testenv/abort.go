package testenv

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FailNextTxnOffsetCommit makes the cluster's next TxnOffsetCommit fail
// every partition with CONCURRENT_TRANSACTIONS, an abortable error, as in
// a rebalance: kgo aborts the transaction and the session goes on. Later
// commits are answered as usual (kfake drops the control after one use).
func FailNextTxnOffsetCommit(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		return RefuseTxnOffsetCommit(kr, kerr.ConcurrentTransactions.Code), nil, true
	})
}

// FailTxnOffsetCommits fails the cluster's TxnOffsetCommits as
// FailNextTxnOffsetCommit does, each for which fail returns true; fail is
// called with the number of the commit (1, 2, ...), one call at a time.
func FailTxnOffsetCommits(c *kfake.Cluster, fail func(n int) bool) {
	var mu sync.Mutex
	n := 0
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		n++
		if !fail(n) {
			return nil, nil, false
		}
		return RefuseTxnOffsetCommit(kr, kerr.ConcurrentTransactions.Code), nil, true
	})
}

// RefuseTxnOffsetCommit answers a TxnOffsetCommit (kr) with the error
// code for every partition.
func RefuseTxnOffsetCommit(kr kmsg.Request, code int16) kmsg.Response {
	req := kr.(*kmsg.TxnOffsetCommitRequest)
	resp := req.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewTxnOffsetCommitResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// RefuseCommitsPast refuses, as in a rebalance (an abortable error,
// CONCURRENT_TRANSACTIONS), the first n TxnOffsetCommits of group that
// commit partition 0 of a topic past offset at: of any topic if topicID is
// zero, else of the topic with that ID or name (a request names topics by
// one or the other). It returns how many it refused so far.
func RefuseCommitsPast(c *kfake.Cluster, group, topic string, topicID [16]byte, at int64, n int) func() int {
	return RefuseCommitsPastSkipping(c, group, topic, topicID, at, 0, n)
}

// RefuseCommitsPastSkipping is RefuseCommitsPast letting the first skip
// of those commits through: it refuses the next n after them.
func RefuseCommitsPastSkipping(c *kfake.Cluster, group, topic string, topicID [16]byte, at int64, skip, n int) func() int {
	var mu sync.Mutex
	refused := 0
	c.ControlKey(kmsg.TxnOffsetCommit.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.TxnOffsetCommitRequest)
		past := false
		for _, rt := range req.Topics {
			ours := topicID == [16]byte{} || rt.Topic == topic || rt.TopicID == topicID
			for _, rp := range rt.Partitions {
				past = past || ours && rp.Partition == 0 && rp.Offset > at
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if req.Group != group || !past || refused == n {
			return nil, nil, false
		}
		if skip > 0 {
			skip--
			return nil, nil, false
		}
		refused++
		return RefuseTxnOffsetCommit(kr, kerr.ConcurrentTransactions.Code), nil, true
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return refused
	}
}
