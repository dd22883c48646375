package testenv

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// RefuseLogins makes a cluster started with kfake.EnableSASL answer every
// SASL login from now on, on any new connection, SASL_AUTHENTICATION_FAILED
// with the message a broker gives, as brokers do once a user's password
// changed on the cluster. Connections already logged in stay up.
func RefuseLogins(cluster *kfake.Cluster) {
	cluster.ControlKey(kmsg.SASLAuthenticate.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		resp := kreq.(*kmsg.SASLAuthenticateRequest).ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
		resp.ErrorMessage = &msg
		return resp, nil, true
	})
}
