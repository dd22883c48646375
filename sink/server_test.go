package sink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredServer: on the real ClickHouse with a password and
// native TLS (a client certificate required), Server dials, migrates and
// inserts; a wrong or missing password is ErrAuthentication, naming the
// user and never the password; a missing client certificate fails the
// handshake. CheckLogin reports all three and passes a server it cannot
// reach (the sink waits for it).
func TestRealSecuredServer(t *testing.T) {
	ch := testenv.RealClickHouseSecure(t)
	_, db := ch.DB(t)
	good := Server{Addr: ch.Addr, Password: secret.New(ch.Password(t)), TLS: ch.TLS()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := good.Dial(ctx, db, false)
	if err != nil {
		t.Fatalf("TLS and password: %v", err)
	}
	defer conn.Close()
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate over TLS: %v", err)
	}
	if err := good.CheckLogin(ctx); err != nil {
		t.Fatalf("CheckLogin: %v", err)
	}

	wrong := good
	wrong.Password = secret.New("not-" + ch.Password(t))
	none := good
	none.Password = secret.Secret{}
	for name, s := range map[string]Server{"wrong password": wrong, "no password": none} {
		_, err := s.Dial(ctx, db, false)
		if !errors.Is(err, ErrAuthentication) || !strings.Contains(err.Error(), `"default"`) || strings.Contains(err.Error(), ch.Password(t)) {
			t.Errorf("%s: %v; want ErrAuthentication naming user default, without the password", name, err)
		}
		if err := s.CheckLogin(ctx); !errors.Is(err, ErrAuthentication) {
			t.Errorf("%s: CheckLogin = %v", name, err)
		}
	}
	noCert := good
	noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
	if err := noCert.CheckLogin(ctx); err == nil {
		t.Error("no client certificate: CheckLogin passed")
	} else {
		t.Logf("no client certificate: %v", err)
	}
	if err := (Server{Addr: testenv.FreeAddr(t)}).CheckLogin(ctx); err != nil {
		t.Errorf("unreachable server: CheckLogin = %v, want nil (the sink waits for it)", err)
	}
}
