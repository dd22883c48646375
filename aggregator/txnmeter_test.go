package aggregator

import (
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// txnMeter measures each transaction of an aggregator's Kafka client, as
// kgo hooks (stream.Config.ClientOptions) see it: the records it buffered
// between two EndTxn requests (the runtime produces a transaction's records
// only between its Begin and its End, from one run loop), and the time from
// its first record to the EndTxn response.
type txnMeter struct {
	aggregates, changelog, balances string

	mu          sync.Mutex
	cur         txnCount
	first       time.Time // first record of the current transaction
	ends        int       // EndTxn responses
	finalTxs    int       // transactions that carried a FINAL revision
	balanceTxs  int       // transactions that carried a balance
	max         txnCount  // the largest of each count over the transactions
	longest     time.Duration
	finals      int       // FINAL revisions buffered, in all transactions
	lastEnd     time.Time // EndTxn response of the last transaction with a FINAL
	lastBalance time.Time // EndTxn response of the last transaction with a balance
	spans       []txnSpan // every transaction with records, in order
}

// txnSpan is one transaction: its records, and the time from its first
// record to its EndTxn response.
type txnSpan struct {
	txnCount
	d time.Duration
}

// txnCount counts one transaction's records.
type txnCount struct {
	records, finals, balances, changelog, tombstones int
	// bytes sums the keys and values of its records; balanceBytes those
	// of its balances.
	bytes, balanceBytes int
}

// newTxnMeter measures the transactions of an aggregator on the topics of
// names.
func newTxnMeter(names topics.Names) *txnMeter {
	return &txnMeter{aggregates: names.AggregatesTopic(), changelog: names.AggregateChangelogTopic(), balances: names.BalancesTopic()}
}

// OnProduceRecordBuffered implements kgo.HookProduceRecordBuffered.
func (m *txnMeter) OnProduceRecordBuffered(r *kgo.Record) {
	final := false
	if r.Topic == m.aggregates {
		var a schemas.Aggregate
		final = schemas.DecodeInto(r.Value, &a) == nil && a.Status == schemas.StatusFinal
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur.records == 0 {
		m.first = time.Now()
	}
	m.cur.records++
	m.cur.bytes += len(r.Key) + len(r.Value)
	if final {
		m.cur.finals++
		m.finals++
	}
	if r.Topic == m.balances {
		m.cur.balances++
		m.cur.balanceBytes += len(r.Key) + len(r.Value)
	}
	if r.Topic == m.changelog {
		m.cur.changelog++
		if r.Value == nil {
			m.cur.tombstones++
		}
	}
}

// OnBrokerRead implements kgo.HookBrokerRead: an EndTxn response ends the
// transaction.
func (m *txnMeter) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.EndTxn) || err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ends++
	if m.cur.finals > 0 {
		m.finalTxs++
		m.lastEnd = time.Now()
	}
	if m.cur.balances > 0 {
		m.balanceTxs++
		m.lastBalance = time.Now()
	}
	if m.cur.records > 0 {
		d := time.Since(m.first)
		if d > m.longest {
			m.longest = d
		}
		m.spans = append(m.spans, txnSpan{d: d, txnCount: m.cur})
	}
	m.max.records = max(m.max.records, m.cur.records)
	m.max.finals = max(m.max.finals, m.cur.finals)
	m.max.balances = max(m.max.balances, m.cur.balances)
	m.max.changelog = max(m.max.changelog, m.cur.changelog)
	m.max.tombstones = max(m.max.tombstones, m.cur.tombstones)
	m.max.bytes = max(m.max.bytes, m.cur.bytes)
	m.max.balanceBytes = max(m.max.balanceBytes, m.cur.balanceBytes)
	m.cur = txnCount{}
}

// reset forgets what was measured (the transactions of a set-up phase).
func (m *txnMeter) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ends, m.finalTxs, m.balanceTxs, m.finals, m.longest, m.max, m.spans = 0, 0, 0, 0, 0, txnCount{}, nil
}

// crashed forgets the records of a transaction that never ended (its
// client crashed): they are not the next transaction's.
func (m *txnMeter) crashed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.finals -= m.cur.finals
	m.cur = txnCount{}
}

type txnReport struct {
	ends, finalTxs, balanceTxs, finals int
	// balances counts the balances of the transactions that ended.
	balances    int
	max         txnCount
	longest     time.Duration
	lastEnd     time.Time
	lastBalance time.Time
	spans       []txnSpan
}

func (m *txnMeter) report() txnReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	rep := txnReport{ends: m.ends, finalTxs: m.finalTxs, balanceTxs: m.balanceTxs, finals: m.finals, max: m.max, longest: m.longest,
		lastEnd: m.lastEnd, lastBalance: m.lastBalance, spans: append([]txnSpan(nil), m.spans...)}
	for _, sp := range m.spans {
		rep.balances += sp.balances
	}
	return rep
}
