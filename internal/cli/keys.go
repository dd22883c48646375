package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/kafka"
)

// KeysCmd is `meterline keys`: API keys of the HTTP ingest.
type KeysCmd struct {
	Create KeysCreateCmd `cmd:"" help:"Make an API key; its token is printed once, on standard output, and only its hash is stored."`
	List   KeysListCmd   `cmd:"" help:"List the API keys (never their tokens) and tenants."`
	Revoke KeysRevokeCmd `cmd:"" help:"Revoke an API key: every ingest replica refuses it within seconds."`
}

// TenantsCmd is `meterline tenants`.
type TenantsCmd struct {
	Set  TenantsSetCmd  `cmd:"" help:"Make a tenant, or replace its set of customers."`
	List TenantsListCmd `cmd:"" help:"List the tenants."`
}

// withKeysAdmin calls f with an Admin on the keys topic and ctx bounded by
// timeout (the keys and tenants commands' --timeout), and closes the
// Admin's client when f returns.
func withKeysAdmin(ctx context.Context, g *Globals, timeout time.Duration, f func(context.Context, *ingest.Admin) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	cl, err := kafka.NewClient(kc)
	if err != nil {
		return err
	}
	defer cl.Close()
	return f(ctx, ingest.NewAdmin(cl, g.Topic.KeysTopic()))
}

// KeysCreateCmd is `meterline keys create`.
type KeysCreateCmd struct {
	Tenant    string        `required:"" help:"The tenant the key belongs to; made with --allow-customers when it does not exist."`
	Customers []string      `name:"allow-customers" nonempty:"all of the tenant's customers" help:"Customers the key may write: IDs, prefixes ending in * (team-*), or * (all of the tenant's). Default: all of the tenant's."`
	Meters    []string      `name:"allow-meters" nonempty:"any meter" help:"Meters the key may write: exact meter names, no patterns (a name with * is refused). Default: any."`
	Rate      float64       `help:"Events per second the key may send to each ingest replica; 0: no bound (its refused requests are bounded by the ingest's refusal budget)." default:"0"`
	Note      string        `help:"A note kept with the key: who or what it is for."`
	Timeout   time.Duration `help:"Deadline for the whole command." default:"30s"`
}

// Run makes the key.
func (c *KeysCreateCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	return withKeysAdmin(ctx, g, c.Timeout, func(ctx context.Context, adm *ingest.Admin) error {
		k, token, err := adm.CreateKey(ctx, ingest.KeySpec{Tenant: c.Tenant, Customers: c.Customers, Meters: c.Meters, Rate: c.Rate, CreatedBy: c.Note})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdio.Stderr, "key %s of tenant %s: customers %s; meters %s; rate %s. The token below is shown once: keep it secret.\n",
			k.ID, k.Tenant, strings.Join(k.Customers, ","), orAny(k.Meters), rateText(k.Rate))
		fmt.Fprintln(stdio.Stdout, token)
		return nil
	})
}

func orAny(ms []string) string {
	if len(ms) == 0 {
		return "any"
	}
	return strings.Join(ms, ",")
}

func rateText(r float64) string {
	if r <= 0 {
		return "unbounded"
	}
	return fmt.Sprintf("%g events/s per replica", r)
}

// KeysListCmd is `meterline keys list`.
type KeysListCmd struct {
	JSON    bool          `help:"Print JSON: the stored keys (hashes, never tokens) and tenants."`
	Timeout time.Duration `help:"Deadline for the whole command." default:"30s"`
}

// Run lists the keys.
func (c *KeysListCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	keys, tenants, err := listKeys(ctx, g, c.Timeout)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(stdio.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"keys": keys, "tenants": tenants})
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tCUSTOMERS\tMETERS\tRATE\tCREATED\tSTATE\tNOTE")
	for _, k := range keys {
		state := "active"
		if !k.Active() {
			state = "revoked " + k.Revoked.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Tenant, strings.Join(k.Customers, ","), orAny(k.Meters),
			rateText(k.Rate), k.Created.Format(time.RFC3339), state, k.CreatedBy)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stdout, "%d keys, %d tenants\n", len(keys), len(tenants))
	return nil
}

// KeysRevokeCmd is `meterline keys revoke`.
type KeysRevokeCmd struct {
	ID      string        `arg:"" help:"ID of the key (from keys list)."`
	Timeout time.Duration `help:"Deadline for the whole command." default:"30s"`
}

// Run revokes the key.
func (c *KeysRevokeCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	return withKeysAdmin(ctx, g, c.Timeout, func(ctx context.Context, adm *ingest.Admin) error {
		k, err := adm.RevokeKey(ctx, c.ID)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdio.Stdout, "revoked key %s of tenant %s at %s\n", k.ID, k.Tenant, k.Revoked.Format(time.RFC3339))
		return nil
	})
}

// TenantsSetCmd is `meterline tenants set`.
type TenantsSetCmd struct {
	Name      string        `arg:"" help:"Tenant name: 1 to 128 bytes of UTF-8 without /, blanks, control or invisible characters, not none (the metrics' tenant label without a valid key)."`
	Customers []string      `name:"allow-customers" required:"" help:"The tenant's customers (those its keys may write): IDs, prefixes ending in * (team-*), or *."`
	Timeout   time.Duration `help:"Deadline for the whole command." default:"30s"`
}

// Run sets the tenant.
func (c *TenantsSetCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	return withKeysAdmin(ctx, g, c.Timeout, func(ctx context.Context, adm *ingest.Admin) error {
		t, err := adm.SetTenant(ctx, c.Name, c.Customers)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdio.Stdout, "tenant %s: customers %s\n", t.Name, strings.Join(t.Customers, ","))
		return nil
	})
}

// TenantsListCmd is `meterline tenants list`.
type TenantsListCmd struct {
	Timeout time.Duration `help:"Deadline for the whole command." default:"30s"`
}

// Run lists the tenants.
func (c *TenantsListCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	keys, tenants, err := listKeys(ctx, g, c.Timeout)
	if err != nil {
		return err
	}
	active := map[string]int{}
	for _, k := range keys {
		if k.Active() {
			active[k.Tenant]++
		}
	}
	for _, t := range tenants {
		fmt.Fprintf(stdio.Stdout, "%s\tcustomers %s\t%d active keys\n", t.Name, strings.Join(t.Customers, ","), active[t.Name])
	}
	return nil
}

// listKeys reads the keys and tenants of the keys topic within timeout.
func listKeys(ctx context.Context, g *Globals, timeout time.Duration) (keys []ingest.Key, tenants []ingest.Tenant, err error) {
	err = withKeysAdmin(ctx, g, timeout, func(ctx context.Context, adm *ingest.Admin) error {
		keys, tenants, err = adm.List(ctx)
		return err
	})
	return keys, tenants, err
}
