package cli

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/testenv"
)

// TestLagShowsHeldRecords: a producer (not Meterline's) left a
// transaction open on partition 0 of a topic a group reads, and another
// producer's committed transaction followed it. The group has read
// everything up to the last stable offset, so it is not behind, but
// `meterline lag` shows partition 0 even without --all, with the five
// records past that offset (the open transaction's record, the three
// committed ones and their marker) in its RECORDS HELD column, and a note
// under the table names the runbook. Partition 1, which holds nothing, is
// shown with --all only, holding 0; nothing held, no note.
func TestLagShowsHeldRecords(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		testLagShowsHeld(t, brokers)
	})
	t.Run("real-kafka", func(t *testing.T) {
		testLagShowsHeld(t, testenv.RealKafka(t))
	})
}

func testLagShowsHeld(t *testing.T, brokers []string) {
	ctx := context.Background()
	topic, group := testenv.Name(t, "held"), testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 2, nil)
	open := testenv.HoldPartition(t, brokers, topic, 0, group+"-open")
	adm := testenv.Admin(t, brokers)
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 0, -1)
	offs.AddOffset(topic, 1, 0, -1)
	if _, err := adm.CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}

	// held returns the RECORDS HELD column of each partition of topic
	// stdout shows.
	held := func(stdout string) map[string]string {
		out := map[string]string{}
		for _, l := range strings.Split(stdout, "\n") {
			if f := strings.Fields(l); len(f) == 8 && f[1] == topic {
				out[f[2]] = f[7]
			}
		}
		return out
	}
	const note = "see docs/operations.md, MeterlineInputHeldByOpenTransaction"
	for _, all := range []bool{false, true} {
		args := []string{"lag", "--brokers", strings.Join(brokers, ","), "--group", group}
		want := map[string]string{"0": "5"}
		if all {
			args = append(args, "--all")
			want["1"] = "0"
		}
		code, stdout, stderr := run(t, "", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
		}
		if !strings.Contains(stdout, "RECORDS HELD") {
			t.Errorf("%v: no RECORDS HELD column:\n%s", args, stdout)
		}
		if got := held(stdout); len(got) != len(want) || got["0"] != want["0"] || got["1"] != want["1"] {
			t.Errorf("%v: records held per partition %v, want %v:\n%s", args, got, want, stdout)
		}
		if !strings.Contains(stdout, "0 behind, 0 records behind") {
			t.Errorf("%v: stdout %q; want nothing behind", args, stdout)
		}
		if !strings.Contains(stdout, "note: 1 partition holds 5 records past its last stable offset") || !strings.Contains(stdout, note) {
			t.Errorf("%v: no note of the held partition and its runbook:\n%s", args, stdout)
		}
	}

	if err := open.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	// The abort marker, offset 5, which a broker writes once
	// EndTransaction has returned: the last stable offset is then 6.
	testenv.WaitPartitionEnd(t, adm.ListCommittedOffsets, topic, 0, 6)
	code, stdout, stderr := run(t, "", "lag", "--brokers", strings.Join(brokers, ","), "--group", group, "--all")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if got := held(stdout); got["0"] != "0" || got["1"] != "0" {
		t.Errorf("after the abort: records held per partition %v, want 0 and 0:\n%s", got, stdout)
	}
	if strings.Contains(stdout, "note:") {
		t.Errorf("after the abort, nothing is held, yet:\n%s", stdout)
	}
}

// TestPrintLagHeldNote: the note under the table counts the partitions
// holding records past their last stable offset, and their records.
func TestPrintLagHeldNote(t *testing.T) {
	rows := []lag.Row{
		{Group: "g", Topic: "t", Partition: 0, Committed: 7, End: 7, High: 10},
		{Group: "g", Topic: "t", Partition: 1, Committed: 3, End: 5, High: 5, Records: 2, Behind: 1500 * time.Millisecond},
		{Group: "g", Topic: "u", Partition: 0, Committed: -1, End: 4, High: 6, Records: 4, Behind: time.Second},
	}
	var b strings.Builder
	printLag(&b, rows, false, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	var got []string
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"GROUP TOPIC PARTITION COMMITTED END RECORDS BEHIND SECONDS BEHIND RECORDS HELD",
		"g t 0 7 7 0 0.0 3",
		"g t 1 3 5 2 1.5 0",
		"g u 0 - 4 4 1.0 2",
		"3 partitions, 2 behind, 6 records behind in total (2026-01-02T03:04:05Z)",
		"note: 2 partitions hold 5 records past their last stable offsets: a transaction open there stops the group's reads " +
			"while its lag reads 0 (see docs/operations.md, MeterlineInputHeldByOpenTransaction)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("printLag:\n%s\nwant (spaces squeezed):\n%s", b.String(), strings.Join(want, "\n"))
	}
}
