package dedup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// setEventsRetention sets retention.ms of the harness's events topic.
func setEventsRetention(t *testing.T, h *harness, ms int64) {
	t.Helper()
	v := strconv.FormatInt(ms, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := testenv.Admin(t, h.brokers).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, h.names.EventsTopic())
	if err == nil {
		_, err = rs.On(h.names.EventsTopic(), nil)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// keyUse returns the last use of key id that the changelog of partition 0
// records, and whether it records one (a tombstone: none).
func keyUse(t *testing.T, h *harness, id string) (int64, bool) {
	t.Helper()
	var v []byte
	for _, r := range readTopic(t, h, h.names.DedupChangelogTopic()) {
		if r.Partition == 0 && bytes.Equal(r.Key, keyUseKey(id)) {
			v = r.Value
		}
	}
	if len(v) != keyUseLen {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(v)), true
}

// waitKeyUse waits until the changelog records a use of key id at or
// after least.
func waitKeyUse(t *testing.T, h *harness, id string, least int64) int64 {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if at, ok := keyUse(t, h, id); ok && at >= least {
			return at
		}
		if time.Now().After(deadline) {
			t.Fatalf("the changelog records no use of key %q at or after %s", id, msTime(least))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// refused starts dedup with cfg and returns the error it stops with; the
// test fails if it runs.
func refused(t *testing.T, h *harness, cfg Config) error {
	t.Helper()
	st := h.start(cfg)
	err, ok := st.wait(30 * time.Second)
	if !ok {
		t.Fatal("dedup runs without a key that signed records the events topic still holds")
	}
	return err
}

// TestRetiredKeyStillNeeded: dedup records the broker time at which each
// key last signed, in its state and so in its changelog, and refuses a
// key ring that lacks a key whose last use is within the events topic's
// retention, also after its local state is wiped (restored from the
// changelog); once the partition watermark has passed that retention, the
// key may go, and its entry is deleted.
func TestRetiredKeyStillNeeded(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		const retention = 5 * time.Minute
		setEventsRetention(t, h, retention.Milliseconds())
		k1 := h.keys[0]
		k2, err := GenerateKey("test-2")
		if err != nil {
			t.Fatal(err)
		}
		withRing := func(instance string, fs vfs.FS, keys ...Key) Config {
			cfg := h.config(instance, fs)
			cfg.Keys = keys
			return cfg
		}
		now := time.Now().UnixMilli()
		local := vfs.NewMem()

		// k1 signs ticks (and would sign re-routes).
		st := h.start(withRing("a", local, k1))
		h.produce(h.event("acme", "api_calls", "e1", 1, now-hour, now))
		h.caughtUp()
		used := waitKeyUse(t, h, k1.ID, now)
		if err := st.stop(); err != nil {
			t.Fatal(err)
		}

		// Removed at once: refused, with local state and restored from
		// the changelog alike.
		for _, tc := range []struct {
			name string
			fs   vfs.FS
		}{{"local state", local}, {"state restored from the changelog", vfs.NewMem()}} {
			err := refused(t, h, withRing("a", tc.fs, k2))
			if !errors.Is(err, ErrKeyStillNeeded) {
				t.Fatalf("%s: Run = %v, want ErrKeyStillNeeded", tc.name, err)
			}
			t.Logf("%s: %v", tc.name, err)
			for _, want := range []string{`"` + k1.ID + `"`, msTime(used), msTime(used + retention.Milliseconds()), "put it back in the ring"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%s: the error does not say %q: %v", tc.name, want, err)
				}
			}
		}
		// Infinite retention: the key must stay for ever.
		setEventsRetention(t, h, -1)
		if err := refused(t, h, withRing("a", vfs.NewMem(), k2)); !errors.Is(err, ErrKeyStillNeeded) || !strings.Contains(err.Error(), "for ever") {
			t.Fatalf("with infinite retention, Run = %v, want ErrKeyStillNeeded saying the key stays for ever", err)
		}
		setEventsRetention(t, h, retention.Milliseconds())

		// Rotated: k2 signs, k1 verifies; the partition's broker time
		// moves past k1's last use plus the retention.
		st = h.start(withRing("a", local, k2, k1))
		later := used + retention.Milliseconds() + 2*time.Minute.Milliseconds()
		h.produce(h.event("acme", "api_calls", "e2", 1, later-hour, later))
		h.caughtUp()
		waitKeyUse(t, h, k2.ID, later)
		if at, _ := keyUse(t, h, k1.ID); at != used {
			t.Errorf("k1's last use moved to %s while it only verified, want %s", msTime(at), msTime(used))
		}
		if err := st.stop(); err != nil {
			t.Fatal(err)
		}

		// Now k1 may go, from a wiped state too; its entry is deleted.
		st = h.start(withRing("a", vfs.NewMem(), k2))
		h.produce(h.event("acme", "api_calls", "e3", 1, later-hour, later))
		h.caughtUp()
		if err, done := st.wait(0); done {
			t.Fatalf("dedup stopped once k1's records had left the events topic: %v", err)
		}
		if got := h.outputs().byID(); got["e3"] != 1 {
			t.Errorf("e3 forwarded %d times, want 1", got["e3"])
		}
		deadline := time.Now().Add(time.Minute)
		for {
			if _, ok := keyUse(t, h, k1.ID); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the changelog still records k1's last use after it left the ring")
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}

// TestKeyUseOutlivesRetention: the last use of a key that no longer signs
// is written again with the other metadata keys, so that after the
// changelog's retention removed the records that first carried it, a
// restore still refuses a ring without the key.
func TestKeyUseOutlivesRetention(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		setEventsRetention(t, h, time.Hour.Milliseconds())
		k1 := h.keys[0]
		k2, err := GenerateKey("test-2")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UnixMilli()
		short := func(cfg Config) Config { // buckets that expire in minutes
			cfg.Window, cfg.Skew, cfg.Bucket = 2*time.Hour, time.Minute, time.Minute
			return cfg
		}
		cfg := short(h.config("a", vfs.NewMem()))
		st := h.start(cfg)
		h.produce(h.event("acme", "api_calls", "e1", 1, now-hour, now))
		h.caughtUp()
		used := waitKeyUse(t, h, k1.ID, now)
		if err := st.stop(); err != nil {
			t.Fatal(err)
		}
		adm := testenv.Admin(t, h.brokers)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		first := changelogEnd(ctx, t, adm, h.names.DedupChangelogTopic())

		// Rotated: k2 signs, k1 only verifies; ten minutes of broker time
		// later, buckets expire and the metadata is written again.
		h.keys = []Key{k2, k1}
		cfg.Keys = h.keys
		st = h.start(cfg)
		h.produce(h.tick(0, now+10*time.Minute.Milliseconds()))
		h.caughtUp()
		within(t, 30*time.Second, "k1's last use was written again", func() bool {
			for _, r := range readTopic(t, h, h.names.DedupChangelogTopic()) {
				if r.Offset >= first && bytes.Equal(r.Key, keyUseKey(k1.ID)) {
					return true
				}
			}
			return false
		})
		if err := st.stop(); err != nil {
			t.Fatal(err)
		}
		// Retention removes what the first run wrote.
		deleteChangelogBelow(ctx, t, adm, h.names.DedupChangelogTopic(), first)
		cfg = short(h.config("b", vfs.NewMem())) // a full restore from what is left
		cfg.Keys = []Key{k2}
		err = refused(t, h, cfg)
		if !errors.Is(err, ErrKeyStillNeeded) || !strings.Contains(err.Error(), msTime(used)) {
			t.Fatalf("Run = %v, want ErrKeyStillNeeded naming k1's last use %s", err, msTime(used))
		}
	})
}

// TestRetiredKeyForgotten: a key named in ForgetKeys may leave the ring
// within the retention (a leaked secret): dedup runs, and deletes its
// entry.
func TestRetiredKeyForgotten(t *testing.T) {
	h := newHarness(t, nil, 1)
	setEventsRetention(t, h, time.Hour.Milliseconds())
	k1 := h.keys[0]
	k2, err := GenerateKey("test-2")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	st := h.start(h.config("a", vfs.NewMem()))
	h.produce(h.event("acme", "api_calls", "e1", 1, now-hour, now))
	h.caughtUp()
	waitKeyUse(t, h, k1.ID, now)
	if err := st.stop(); err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a", vfs.NewMem())
	cfg.Keys, cfg.ForgetKeys = []Key{k2}, []string{k1.ID}
	st = h.start(cfg)
	h.produce(h.event("acme", "api_calls", "e2", 1, now-hour, now))
	h.caughtUp()
	if err, done := st.wait(0); done {
		t.Fatalf("dedup stopped with the key forgotten: %v", err)
	}
	if _, ok := keyUse(t, h, k1.ID); ok {
		t.Error("the changelog still records the forgotten key")
	}

	cfg.Keys = []Key{k1}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "forget-ids") {
		t.Errorf("Validate with a forgotten key in the ring = %v, want a forget-ids error", err)
	}
}

// TestReplacedKeySecret: a key ID given another secret is not the key
// that signed under it: dedup refuses the ring as if the key were gone.
func TestReplacedKeySecret(t *testing.T) {
	h := newHarness(t, nil, 1)
	setEventsRetention(t, h, time.Hour.Milliseconds())
	now := time.Now().UnixMilli()
	st := h.start(h.config("a", vfs.NewMem()))
	h.produce(h.event("acme", "api_calls", "e1", 1, now-hour, now))
	h.caughtUp()
	waitKeyUse(t, h, h.keys[0].ID, now)
	if err := st.stop(); err != nil {
		t.Fatal(err)
	}
	again, err := GenerateKey(h.keys[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a", vfs.NewMem())
	cfg.Keys = []Key{again}
	err = refused(t, h, cfg)
	if !errors.Is(err, ErrKeyStillNeeded) || !strings.Contains(err.Error(), "another secret") {
		t.Fatalf("Run = %v, want ErrKeyStillNeeded saying the key has another secret", err)
	}
	t.Log(err)
}

// TestKeyUseUpgrade: state written before last uses were recorded has
// none: dedup refuses nothing, whatever the ring, and starts recording.
func TestKeyUseUpgrade(t *testing.T) {
	h := newHarness(t, nil, 1)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], 1)
	var zero [8]byte
	for k, v := range map[string][]byte{string(keyPartitions): n[:], string(keyKeyScheme): []byte(schemas.DedupedKeyScheme), string(keyUpgrade): zero[:]} {
		h.produce(&kgo.Record{Topic: h.names.DedupChangelogTopic(), Partition: 0, Key: []byte(k), Value: v})
	}
	k2, err := GenerateKey("test-2")
	if err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a", vfs.NewMem())
	cfg.Keys = []Key{k2}
	st := h.start(cfg)
	now := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "e1", 1, now-hour, now))
	h.caughtUp()
	if err, done := st.wait(0); done {
		t.Fatalf("dedup stopped on state without recorded keys: %v", err)
	}
	waitKeyUse(t, h, k2.ID, now)
}
