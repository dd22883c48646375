package testenv

import (
	"io"
	"net/http"
	"testing"
)

// StatusWithHost returns the status of a GET of url sent with host as
// its Host header, the body read and dropped.
func StatusWithHost(t testing.TB, url, host string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
