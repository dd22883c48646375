package cli

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestRealSecuredSinkCannotPark: a sink whose principal lacks Write on
// usage.rejected (one documented ACL missing) cannot park a record that
// does not decode. It must not commit the offsets past that record, which
// would lose it (neither in ClickHouse nor parked): it stops, naming the
// ACL, and the group's offset stays below the record.
func TestRealSecuredSinkCannotPark(t *testing.T) {
	w := newSecuredSink(t, "secpark")
	k, names, adm, group := w.k, w.names, w.adm, w.group
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	revokeACL(t, ctx, adm, kadm.NewACLs().Allow("User:sink").AllowHosts("*").Operations(kadm.OpWrite).
		Topics(names.RejectedTopic()).ResourcePatternType(kadm.ACLPatternLiteral))
	// A record of the duplicates topic that does not decode: the sink
	// parks such a record in usage.rejected.
	cl, err := kafka.NewClient(k.Config(t, "admin", kafka.ScramSHA512))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: names.DuplicatesTopic(), Value: []byte("not avro")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	sink := w.start(t, "--max-batch-wait", "200ms")
	select {
	case code := <-sink.done:
		sink.cancel = nil
		if code != 1 {
			t.Errorf("sink exit %d, want 1", code)
		}
		if want := "Write on topic " + names.RejectedTopic(); !strings.Contains(sink.logs.String(), want) {
			t.Errorf("the sink's error does not say %q:\n%s", want, testenv.Tail(sink.logs.String(), 10))
		}
	case <-time.After(time.Minute):
		t.Errorf("the sink did not stop in a minute:\n%s", testenv.Tail(sink.logs.String(), 10))
		sink.stop(t)
	}
	offsets, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offsets.Lookup(names.DuplicatesTopic(), 0); ok && o.At > 0 {
		t.Errorf("the group committed offset %d of %s/0 past the record it could not park", o.At, names.DuplicatesTopic())
	}
}

// revokeACL deletes the ACLs b matches, as admin, and waits until the
// broker lists none of them.
func revokeACL(t *testing.T, ctx context.Context, adm *kadm.Client, b *kadm.ACLBuilder) {
	t.Helper()
	if _, err := adm.DeleteACLs(ctx, b); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		res, err := adm.DescribeACLs(ctx, b)
		if err == nil && len(res) == 1 && res[0].Err == nil && len(res[0].Described) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ACL still listed after 30 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// securedSink is a sink's world on the secured broker and ClickHouse:
// topics under a prefix of its own, User:sink's documented ACLs under it,
// and a migrated database.
type securedSink struct {
	k          testenv.SecuredKafka
	ch         testenv.SecuredClickHouse
	db, prefix string
	group      string // the sink's consumer group, under prefix
	names      topics.Names
	adm        *kadm.Client
}

func newSecuredSink(t *testing.T, base string) *securedSink {
	t.Helper()
	w := &securedSink{k: testenv.RealKafkaSASL(t), ch: testenv.RealClickHouseSecure(t), prefix: testenv.Name(t, base) + "."}
	_, w.db = w.ch.DB(t)
	w.group = w.prefix + "meterline-sink"
	w.names = securedTopics(t, w.k, w.prefix, 1)
	w.adm = w.k.Admin(t)
	grant(t, w.adm, documentedACLs(t), w.prefix, "sink", "sink")
	if code, out := command(t, time.Minute, "", append([]string{"migrate", "--database", w.db}, w.ch.Flags()...)...); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	return w
}

// start runs `meterline sink` as User:sink, instance node-1, with args.
func (w *securedSink) start(t *testing.T, args ...string) *background {
	t.Helper()
	return start(t, "meterline sink", slices.Concat([]string{"sink", "--log-level", "info", "--topic-prefix", w.prefix,
		"--instance-id", "node-1", "--session-timeout", "6s", "--group", w.group, "--metrics-addr", testenv.FreeAddr(t),
		"--database", w.db, "--commit-interval", "300ms"}, args, w.ch.Flags(), w.k.Flags("sink", kafka.ScramSHA512))...)
}
