package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredSinkCannotPark: a sink whose principal lacks Write on
// usage.rejected (one documented ACL missing) cannot park a record that
// does not decode. It must not commit the offsets past that record, which
// would lose it (neither in ClickHouse nor parked): it stops, naming the
// ACL, and the group's offset stays below the record.
func TestRealSecuredSinkCannotPark(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	ch := testenv.RealClickHouseSecure(t)
	_, db := ch.DB(t)
	prefix := testenv.Name(t, "secpark") + "."
	names := securedTopics(t, k, prefix, 1)
	adm := k.Admin(t)
	grant(t, adm, documentedACLs(t), prefix, "sink", "sink")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	noWrite := kadm.NewACLs().Allow("User:sink").AllowHosts("*").Operations(kadm.OpWrite).
		Topics(names.RejectedTopic()).ResourcePatternType(kadm.ACLPatternLiteral)
	revokeACL(t, ctx, adm, noWrite)
	if code, out := command(t, time.Minute, "", append([]string{"migrate", "--database", db}, ch.Flags()...)...); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
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
	group := prefix + "meterline-sink"
	sink := start(t, "meterline sink", append(append([]string{"sink", "--log-level", "info", "--topic-prefix", prefix,
		"--instance-id", "node-1", "--session-timeout", "6s", "--group", group, "--metrics-addr", testenv.FreeAddr(t),
		"--database", db, "--max-batch-wait", "200ms", "--commit-interval", "300ms"}, ch.Flags()...), k.Flags("sink", kafka.ScramSHA512)...)...)
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
