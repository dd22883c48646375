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
