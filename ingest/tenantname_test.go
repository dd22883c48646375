package ingest

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestTenantNameCleanText: a tenant name is 1 to 128 bytes of UTF-8
// without '/', blanks, control or invisible characters (docs/ingest.md).
// It is the tenant label of the ingest's metrics, and is shown on the
// status page and by `keys list`: a name with any blank (a carriage
// return, a no-break space), a control or invisible character (one that
// shows as another tenant's name: "acme" and "acme\u200b"), or bytes that
// are not UTF-8 (JSON would carry U+FFFD in the record, and the tenant
// would never be read back) is refused by SetTenant and CreateKey, and
// nothing is written.
func TestTenantNameCleanText(t *testing.T) {
	a := newKeysAdmin(t)
	ctx := context.Background()
	for _, name := range []string{"acme\r", "acme\u00a0", "ac\u3000me", "acme\u200b", "\u202eemca", "acme\x00", "acme\x7f", "acme\xff", "acme\u0085"} {
		if _, err := a.SetTenant(ctx, name, []string{"acme-*"}); err == nil {
			t.Errorf("SetTenant(%q) made the tenant, want an error", name)
		}
		if k, _, err := a.CreateKey(ctx, KeySpec{Tenant: name, Customers: []string{"acme-*"}}); err == nil {
			t.Errorf("CreateKey for tenant %q made key %s, want an error", name, k.ID)
		}
	}
	ks, ts, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 0 || len(ts) != 0 {
		t.Errorf("keys %v, tenants %v written, want none", ks, ts)
	}
	// A name of letters of any script is a name.
	if _, err := a.SetTenant(ctx, "café-東京", []string{"x"}); err != nil {
		t.Errorf("SetTenant of a name of letters: %v", err)
	}
}

// newKeysAdmin is an Admin of a new keys topic on kfake, without an
// ingest.
func newKeysAdmin(t *testing.T) *Admin {
	t.Helper()
	_, brokers := testenv.KFake(t)
	keys := testenv.Name(t, "keys")
	if _, err := testenv.Admin(t, brokers).CreateTopic(context.Background(), 1, 1, nil, keys); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return NewAdmin(cl, keys)
}
