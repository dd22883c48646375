package kafka_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRefusedPasswordWithStrayBytesSaysSo: a password the brokers refuse
// that begins or ends with whitespace, a line break or a byte order mark
// (a Kubernetes secret made from a file `echo` wrote, passed in
// METERLINE_KAFKA_SASL_PASSWORD; a password file with a second line break
// or saved by an editor with a BOM) is refused with an error that says
// so, never showing the password; a plainly wrong one is not.
func TestRefusedPasswordWithStrayBytesSaysSo(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", password))
	for _, c := range []struct{ pw, says string }{
		{password + "\n", "ends with a line break"},
		{password + "\r\n", "ends with a line break"},
		{password + " ", "ends with whitespace"},
		{"\t" + password, "begins with whitespace"},
		{"\ufeff" + password, "begins with a byte order mark"},
		{"wrong-" + password, ""},
	} {
		cfg := kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(c.pw)}}
		err := kafka.CheckCredentials(ctx(t), cfg)
		if !errors.Is(err, kafka.ErrAuthentication) {
			t.Fatalf("%q: %v, want ErrAuthentication", c.pw, err)
		}
		if strings.Contains(err.Error(), password) {
			t.Fatalf("%q: the error shows the password: %v", c.pw, err)
		}
		if c.says == "" {
			if strings.Contains(err.Error(), "the password") {
				t.Errorf("%q: %v; want no remark on the password's bytes", c.pw, err)
			}
			continue
		}
		if !strings.Contains(err.Error(), "the password "+c.says) {
			t.Errorf("%q: %v; want it to say the password %s", c.pw, err, c.says)
		}
	}
}
