package cli

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestStageStopsWhenANewConnectionIsRefusedItsLogin: a stage whose
// password the brokers refuse on a new connection while it runs (the
// password changed on the cluster; a stage reads it at start only) stops,
// exit status 1, with `kafka: authentication failed` naming the user
// (docs/operations.md, Kafka: SASL and TLS), whichever of its connections
// asks again. Here the broker drops only the fetch connection of the
// stage's session, as a broker does that closes it as idle, or that
// restarts while the group's connection is opened again before the new
// password is set: the group's and the transaction's connections stay up,
// so the group session goes on and no poll returns an error. The
// aggregator and the sink, which write nothing while no input comes, ran
// on for ever, reading nothing, logging the client's refused logins every
// 5 s (dedup stopped at its next tick's transaction).
func TestStageStopsWhenANewConnectionIsRefusedItsLogin(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	for _, c := range []struct {
		stage string
		args  func(t *testing.T) []string
	}{
		{"dedup", func(t *testing.T) []string {
			return []string{"dedup", "--state-dir", t.TempDir(), "--dedup-keys-file", keys}
		}},
		{"aggregate", func(t *testing.T) []string { return []string{"aggregate", "--state-dir", t.TempDir()} }},
		{"sink", func(t *testing.T) []string {
			_, db := testenv.ClickHouseDB(t)
			return []string{"sink", "--migrate", "--database", db, "--clickhouse", testenv.RealClickHouse(t)}
		}},
	} {
		t.Run(c.stage, func(t *testing.T) { testStageStopsOnRefusedLogin(t, c.args(t)) })
	}
}

func testStageStopsOnRefusedLogin(t *testing.T, args []string) {
	cluster, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.Superuser(kafka.ScramSHA512, "stage", "pw-stage"))
	b := strings.Join(brokers, ",")
	sasl := func(user string) []string {
		return []string{"--brokers", b, "--kafka-sasl-mechanism", kafka.ScramSHA512, "--kafka-sasl-user", user}
	}
	t.Setenv(EnvKafkaSASLPassword, "pw-admin")
	if code, _, errOut := run(t, "", append([]string{"topics", "create"}, sasl("admin")...)...); code != 0 {
		t.Fatalf("topics create: exit %d\n%s", code, errOut)
	}
	t.Setenv(EnvKafkaSASLPassword, "pw-stage")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb testenv.SyncBuffer
	done := make(chan int, 1)
	args = slices.Concat(args, []string{"--instance-id", "i1", "--metrics-addr", "127.0.0.1:0"}, sasl("stage"))
	go func() { done <- Main(ctx, args, IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb}) }()
	for !strings.Contains(errb.String(), `"msg":"partition restored"`) && !strings.Contains(errb.String(), `"msg":"partitions assigned`) {
		select {
		case code := <-done:
			t.Fatalf("%s ended (exit %d) before it ran:\n%s", args[0], code, errb.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The password changes: every new login is refused from now on.
	testenv.RefuseLogins(cluster)
	// The broker closes the fetch connection (at one fetch), and only it.
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		return nil, errors.New("connection closed by the test"), true
	})
	select {
	case code := <-done:
		if code != 1 || !strings.Contains(errb.String(), "kafka: authentication failed") ||
			!strings.Contains(errb.String(), "read at start") {
			t.Errorf("exit %d; want 1 and an authentication error saying the password is read at start:\n%s", code, testenv.Tail(errb.String(), 10))
		}
		if strings.Contains(errb.String(), "pw-stage") {
			t.Errorf("the password is shown:\n%s", errb.String())
		}
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatalf("%s ran on for 30 s with its login refused on a new connection:\n%s", args[0], testenv.Tail(errb.String(), 10))
	}
}
