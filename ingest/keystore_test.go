package ingest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// keyWithToken returns an active key of tenant with every customer, and
// its token.
func keyWithToken(t *testing.T, tenant string) (Key, string) {
	t.Helper()
	id, token, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	h := hashToken(token)
	return Key{ID: id, Tenant: tenant, Customers: []string{"*"}, Hash: fmt.Sprintf("%x", h[:])}, token
}

// TestKeysRecordCarriesOneThing: a record of the keys topic changes only
// what its own record key names. A "key/<id>" record that also carries a
// tenant, or a "tenant/<name>" record that also carries a key, is refused
// whole: otherwise it would widen a tenant (or make a key) that the
// tenant's (the key's) own records never said, and that compaction of
// those records never removes.
func TestKeysRecordCarriesOneThing(t *testing.T) {
	ks := NewKeys("meterline.keys", nil)
	acme, acmeToken := keyWithToken(t, "acme")
	ks.apply(tenantRecordKey("acme"), encodeRecord(record{Tenant: &Tenant{Name: "acme", Customers: []string{"acme-*"}}}))
	ks.apply(keyRecordKey(acme.ID), encodeRecord(record{Key: &acme}))

	// A key record that smuggles a wider tenant acme.
	other, _ := keyWithToken(t, "other")
	ks.apply(keyRecordKey(other.ID), encodeRecord(record{Key: &other, Tenant: &Tenant{Name: "acme", Customers: []string{"*"}}}))
	k, tn := ks.Authenticate(acmeToken)
	if k == nil || tn == nil {
		t.Fatal("the acme key does not authenticate")
	}
	if why := k.allows(tn, "globex-1", "api_calls"); why == "" {
		t.Errorf("a key/%s record rewrote tenant acme: its key may now write customer globex-1", other.ID)
	}

	// A tenant record that smuggles a key.
	smuggled, smuggledToken := keyWithToken(t, "acme")
	ks.apply(tenantRecordKey("acme"), encodeRecord(record{Tenant: &Tenant{Name: "acme", Customers: []string{"acme-*"}}, Key: &smuggled}))
	if k, _ := ks.Authenticate(smuggledToken); k != nil {
		t.Errorf("a key carried by a tenant/acme record authenticates (key %s)", smuggled.ID)
	}
	if ks.bad != 2 {
		t.Errorf("%d records counted unreadable, want 2", ks.bad)
	}
}

// TestKeysUnreadableRecordRefusesWhatItNames: the last record of a key (a
// tenant) in the compacted keys topic is what the key (the tenant) is.
// When that record cannot be read — a revocation written by a newer
// Meterline, a damaged value — a replica refuses the key (drops the
// tenant) instead of keeping the state of the record before: that is what
// a replica that starts after compaction sees, and a revocation it cannot
// read must not leave the key working.
func TestKeysUnreadableRecordRefusesWhatItNames(t *testing.T) {
	cases := map[string]func(k Key) []byte{
		"newer version": func(k Key) []byte {
			return []byte(fmt.Sprintf(`{"v":2,"key":{"id":%q,"tenant":"acme","revoked":"2026-12-01T00:00:00Z"}}`, k.ID))
		},
		"not JSON":         func(Key) []byte { return []byte("\x00garbage") },
		"another key's ID": func(Key) []byte { o, _ := keyWithToken(t, "acme"); return encodeRecord(record{Key: &o}) },
	}
	for name, value := range cases {
		t.Run(name, func(t *testing.T) {
			ks := NewKeys("meterline.keys", nil)
			reg := prometheus.NewRegistry()
			newMetrics(reg, ks, nil, newInflight(1, 1), newConns(1, zap.NewNop()))
			k, token := keyWithToken(t, "acme")
			ks.apply(tenantRecordKey("acme"), encodeRecord(record{Tenant: &Tenant{Name: "acme", Customers: []string{"*"}}}))
			ks.apply(keyRecordKey(k.ID), encodeRecord(record{Key: &k}))
			if got, _ := ks.Authenticate(token); got == nil {
				t.Fatal("the key does not authenticate before the unreadable record")
			}
			ks.apply(keyRecordKey(k.ID), value(k))
			if got, _ := ks.Authenticate(token); got != nil {
				t.Errorf("the key still authenticates after an unreadable record replaced its own")
			}
			if ks.bad != 1 {
				t.Errorf("%d records counted unreadable, want 1", ks.bad)
			}
			want := "# HELP meterline_ingest_keys_unreadable_total Records of the keys topic this replica could not read; the key or tenant each names is refused until a readable record replaces it.\n" +
				"# TYPE meterline_ingest_keys_unreadable_total counter\nmeterline_ingest_keys_unreadable_total 1\n"
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meterline_ingest_keys_unreadable_total"); err != nil {
				t.Error(err)
			}
		})
	}
	t.Run("tenant", func(t *testing.T) {
		ks := NewKeys("meterline.keys", nil)
		k, token := keyWithToken(t, "acme")
		ks.apply(tenantRecordKey("acme"), encodeRecord(record{Tenant: &Tenant{Name: "acme", Customers: []string{"*"}}}))
		ks.apply(keyRecordKey(k.ID), encodeRecord(record{Key: &k}))
		ks.apply(tenantRecordKey("acme"), []byte(`{"v":2,"tenant":{"name":"acme","customers":["acme-1"]}}`))
		got, tn := ks.Authenticate(token)
		if got == nil {
			t.Fatal("the key does not authenticate")
		}
		if why := got.allows(tn, "acme-2", "api_calls"); why == "" {
			t.Error("the key still writes customer acme-2 after an unreadable record replaced its tenant")
		}
	})
}

// TestRevokeNeverQuotesAToken: `keys revoke` takes a key ID or a whole
// token. A token with a blank pasted around it revokes its key; anything
// that is neither an ID nor a token — a token with a character too many
// or too few — is refused with an error that does not quote it, since
// most of a live token would then land in a terminal, a CI log or a
// ticket.
func TestRevokeNeverQuotesAToken(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	secret := strings.SplitN(e.token, "_", 3)[2]
	for _, arg := range []string{e.token + "x", e.token[:len(e.token)-1], "'" + e.token + "'"} {
		_, err := e.admin.RevokeKey(ctx, arg)
		if err == nil {
			t.Errorf("RevokeKey(%q) revoked a key", arg)
			continue
		}
		if strings.Contains(err.Error(), secret[:20]) {
			t.Errorf("RevokeKey error quotes the token: %v", err)
		}
	}
	k, err := e.admin.RevokeKey(ctx, " "+e.token+"\n")
	if err != nil || k.Active() || k.ID != tokenID(e.token) {
		t.Fatalf("RevokeKey of the token with blanks around it: %+v, %v", k, err)
	}
}

// TestAdminEndsOnARefusedRead: a principal that may describe the keys
// topic but not read it (the operator's ACLs) gets the broker's refusal
// from List at once, not the end of its context: it never will read it.
func TestAdminEndsOnARefusedRead(t *testing.T) {
	const topic = "meterline.keys"
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(1, topic),
		kfake.Superuser(kafka.ScramSHA512, "keyadmin", "pw-keyadmin"),
		kfake.User(kafka.ScramSHA512, "operator", "pw-operator", kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic,
			Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true}))
	admin := func(user string) *Admin {
		cl, err := kafka.NewClient(kafka.Config{Brokers: brokers,
			SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: user, Password: secret.New("pw-" + user)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return NewAdmin(cl, topic)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := admin("keyadmin").CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	keys, _, err := admin("operator").List(ctx)
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || len(keys) > 0 {
		t.Fatalf("List as a principal without Read: %d keys, %v after %s; want %v", len(keys), err, time.Since(start).Round(time.Millisecond), kerr.TopicAuthorizationFailed)
	}
}

// TestTenantNameNotAReservedLabel: "none" is the tenant label of the
// ingest metrics for requests without a valid key, so a tenant of that
// name would be counted with them. SetTenant and CreateKey refuse it,
// naming the field, and write nothing.
func TestTenantNameNotAReservedLabel(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.admin.SetTenant(ctx, noTenant, []string{"x"}); err == nil || !strings.Contains(err.Error(), `tenant "none"`) {
		t.Errorf("SetTenant(%q) = %v, want an error naming the tenant", noTenant, err)
	}
	if _, _, err := e.admin.CreateKey(ctx, KeySpec{Tenant: noTenant, Customers: []string{"x"}}); err == nil || !strings.Contains(err.Error(), `tenant "none"`) {
		t.Errorf("CreateKey for tenant %q = %v, want an error naming the tenant", noTenant, err)
	}
	_, tenants, err := e.admin.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range tenants {
		if tn.Name == noTenant {
			t.Errorf("tenant %q written: %+v", noTenant, tn)
		}
	}
}

// TestCreateKeyRefusesRateNotANumber: a rate of NaN or ±Inf (which
// `keys create --rate` parses) is refused. JSON has no such number: the
// key's record would not encode, and a token would be printed for a key
// that no replica ever reads.
func TestCreateKeyRefusesRateNotANumber(t *testing.T) {
	a := newKeysAdmin(t)
	for _, r := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		k, token, err := a.CreateKey(context.Background(), KeySpec{Tenant: "acme", Customers: []string{"acme-*"}, Rate: r})
		if err == nil {
			t.Errorf("rate %g: key %s made (token of %d bytes), want an error", r, k.ID, len(token))
		}
	}
	if ks, _, err := a.List(context.Background()); err != nil || len(ks) != 0 {
		t.Errorf("keys %v (%v), want none", ks, err)
	}
}

// TestCreateKeyRefusesMeterPatterns: --allow-meters takes exact meter
// names. A name that looks like a pattern (tok*, *) would be stored as
// an exact name no meter has, and the key could write none of what was
// meant; a name an event's meter may not hold (blank, control or
// invisible characters) matches nothing either. Both are refused, the
// first saying that meters, unlike customers, take no patterns, and no
// key is made.
func TestCreateKeyRefusesMeterPatterns(t *testing.T) {
	a := newKeysAdmin(t)
	ctx := context.Background()
	for _, m := range []string{"tok*", "*", "a*b", "", " ", "tok\u202ens", "tok\x00"} {
		k, _, err := a.CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme-*"}, Meters: []string{"prompts", m}})
		if err == nil {
			t.Errorf("meter %q: key %s made with meters %v, want an error", m, k.ID, k.Meters)
			continue
		}
		if !strings.Contains(err.Error(), strconv.Quote(m)) {
			t.Errorf("meter %q: error %q does not name it", m, err)
		}
		if strings.Contains(m, "*") && !strings.Contains(err.Error(), "exact meter names") {
			t.Errorf("meter %q: error %q does not say meters take exact names", m, err)
		}
	}
	if ks, _, err := a.List(ctx); err != nil || len(ks) != 0 {
		t.Errorf("keys %v (%v), want none", ks, err)
	}
	if _, _, err := a.CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme-*"}, Meters: []string{"tokens", "prompts.v2", "llm/tokens"}}); err != nil {
		t.Errorf("exact meter names refused: %v", err)
	}
}
