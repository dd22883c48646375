package sink

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TopicIDsTable records the topic ID of each input topic whose records
// the database holds (migration 014).
const TopicIDsTable = "sink_topic_ids"

// ErrTopicRecreated is returned (wrapped) when an input topic has another
// topic ID than the one the database recorded for it: it was deleted and
// created again, and its offsets name other records than the rows of the
// database do.
var ErrTopicRecreated = errors.New("input topic deleted and created again")

// kafkaTopicID writes a topic ID as Kafka's tools show it
// (kafka-topics.sh --describe: URL-safe base64 without padding).
func kafkaTopicID(id kadm.TopicID) string { return base64.RawURLEncoding.EncodeToString(id[:]) }

// checkTopicIDs holds the database to the topic IDs of topics: it records
// the ID of a topic it has none for, and returns an error wrapping
// ErrTopicRecreated naming each topic whose ID is another than the one
// recorded. The resume rule skips a record whose (topic, partition,
// offset) is in a table (docs/design.md, The ClickHouse ledger): a topic
// deleted and created again starts its offsets at 0 again, and its
// records at offsets the old log wrote would be skipped as present. A
// topic without an ID (a broker without topic IDs) is not checked.
func (w *Writer) checkTopicIDs(ctx context.Context, adm *kadm.Client, topics []string) error {
	changed, unbound, err := w.topicIDChanges(ctx, adm, topics)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		return w.recreatedError(changed)
	}
	if len(unbound) == 0 {
		return nil
	}
	return recordTopicIDs(ctx, w.getConn(), w.cfg.Database, unbound, w.cfg.QueryTimeout)
}

// topicIDChanges compares the topic IDs of topics with those the database
// recorded: changed describes each topic whose ID is another than the one
// recorded, and unbound lists, as pairs of topic and ID, the topics it has
// none for.
func (w *Writer) topicIDChanges(ctx context.Context, adm *kadm.Client, topics []string) (changed, unbound []string, err error) {
	lctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	tds, err := adm.ListTopics(lctx, topics...)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("sink: read the topic IDs of %s: %w", strings.Join(topics, ", "), err)
	}
	rec, err := recordedTopicIDs(ctx, w.getConn(), w.cfg.Database, topics, w.cfg.QueryTimeout)
	if err != nil {
		return nil, nil, err
	}
	for _, t := range topics {
		td, ok := tds[t]
		if !ok {
			return nil, nil, fmt.Errorf("sink: read the topic ID of %s: the brokers do not list it", t)
		}
		if td.Err != nil {
			return nil, nil, fmt.Errorf("sink: read the topic ID of %s: %w", t, td.Err)
		}
		if td.ID == (kadm.TopicID{}) {
			continue
		}
		id := kafkaTopicID(td.ID)
		var others []string
		for _, r := range rec[t] {
			if r != id {
				others = append(others, r)
			}
		}
		switch {
		case len(others) > 0:
			changed = append(changed, fmt.Sprintf("%s (recorded topic ID %s, now %s)", t, strings.Join(others, ", "), id))
		case len(rec[t]) == 0:
			unbound = append(unbound, t, id)
		}
	}
	return changed, unbound, nil
}

// recreatedError is the error wrapping ErrTopicRecreated for the topics
// changed describes (topicIDChanges).
func (w *Writer) recreatedError(changed []string) error {
	return fmt.Errorf("sink: %w: database %s holds rows of these topics as they were before they were deleted and created again: %s. "+
		"Its rows and progress name offsets of logs that no longer exist, and the sink would skip the new records at those offsets as written. "+
		"Write the new topics into a new database (--database, after meterline migrate --database on it); the rows of this one stay as the old logs' record",
		ErrTopicRecreated, w.cfg.Database, strings.Join(changed, "; "))
}

// fetchFailed is the error that stops the sink when a fetch failed with
// ferr (session.FetchError). A topic deleted and created again while the
// sink reads it fails its fetches with UNKNOWN_TOPIC_ID (kgo keeps the ID
// it started with, and never reads the new log under the old one's
// offsets): the error then says so, as the check on assignment would
// (ErrTopicRecreated), instead of naming only the fetch's error code.
func (w *Writer) fetchFailed(ctx context.Context, ferr error) error {
	if !errors.Is(ferr, kerr.UnknownTopicID) {
		return fmt.Errorf("sink: %w", ferr)
	}
	changed, _, err := w.topicIDChanges(ctx, kadm.NewClient(w.sess.Client()), w.topicNames())
	if err == nil && len(changed) > 0 {
		return fmt.Errorf("%w (the fetch failed: %v)", w.recreatedError(changed), ferr)
	}
	return fmt.Errorf("sink: %w (an input topic was deleted, or deleted and created again: its offsets no longer name the records of the database's rows)", ferr)
}

// recordedTopicIDs returns the topic IDs database db recorded for each of
// topics, sorted.
func recordedTopicIDs(ctx context.Context, conn driver.Conn, db string, topics []string, timeout time.Duration) (map[string][]string, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rows, err := conn.Query(qctx, topicIDsQuery(db, topics))
	if err != nil {
		return nil, fmt.Errorf("sink: read %s: %w", TopicIDsTable, err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var t, id string
		if err := rows.Scan(&t, &id); err != nil {
			return nil, fmt.Errorf("sink: read %s: %w", TopicIDsTable, err)
		}
		out[t] = append(out[t], id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sink: read %s: %w", TopicIDsTable, err)
	}
	for _, ids := range out {
		sort.Strings(ids)
	}
	return out, nil
}

// topicIDsQuery reads the topic IDs database db recorded for topics.
func topicIDsQuery(db string, topics []string) string {
	quoted := make([]string, len(topics))
	for i, t := range topics {
		quoted[i] = quote(t)
	}
	return "SELECT DISTINCT kafka_topic, topic_id FROM " + db + "." + TopicIDsTable +
		" WHERE kafka_topic IN (" + strings.Join(quoted, ", ") + ") ORDER BY kafka_topic, topic_id"
}

// recordTopicIDs records topic IDs, given as pairs of topic and ID, in
// database db.
func recordTopicIDs(ctx context.Context, conn driver.Conn, db string, pairs []string, timeout time.Duration) error {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	now := time.Now().UTC()
	var rows [][]any
	for i := 0; i+1 < len(pairs); i += 2 {
		rows = append(rows, []any{pairs[i], pairs[i+1], now})
	}
	if err := insertRows(ictx, conn, "INSERT INTO "+db+"."+TopicIDsTable+" (kafka_topic, topic_id, recorded_at)", rows); err != nil {
		return fmt.Errorf("sink: record topic IDs in %s: %w", TopicIDsTable, err)
	}
	return nil
}

// topicsOf returns the topics of parts, sorted.
func topicsOf[V any](parts map[tp]V) []string {
	seen := map[string]bool{}
	var out []string
	for k := range parts {
		if !seen[k.topic] {
			seen[k.topic] = true
			out = append(out, k.topic)
		}
	}
	sort.Strings(out)
	return out
}
