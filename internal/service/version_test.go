package service

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestBuildOf(t *testing.T) {
	vcs := func(rev, modified string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261203000000-0123456789ab"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, c := range []struct {
		name   string
		linked string
		read   func() (*debug.BuildInfo, bool)
		want   Build
	}{
		{"linked version wins", "v1.2.0-3-gabc", vcs("0123456789abcdef0123", "false"), Build{"v1.2.0-3-gabc", "0123456789ab", runtime.Version()}},
		{"module version, modified tree", "", vcs("0123456789abcdef0123", "true"),
			Build{"v0.0.0-20261203000000-0123456789ab", "0123456789ab-modified", runtime.Version()}},
		{"no build info", "", none, Build{"(devel)", "", runtime.Version()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := buildOf(c.linked, c.read); got != c.want {
				t.Fatalf("buildOf = %+v, want %+v", got, c.want)
			}
		})
	}
	b := Build{"v1.2.0", "0123456789ab", "go1.26"}
	if got := b.String(); got != "v1.2.0 (revision 0123456789ab) go1.26" {
		t.Fatalf("String = %q", got)
	}
}

// meterline_build_info is 1 with the build as labels, in every registry
// NewRegistry makes.
func TestBuildInfoMetric(t *testing.T) {
	reg := NewRegistry()
	b := BuildOf()
	want := `# HELP meterline_build_info Always 1; its labels say which build the process runs: version, VCS revision and Go version.
# TYPE meterline_build_info gauge
meterline_build_info{goversion="` + b.GoVersion + `",revision="` + b.Revision + `",version="` + b.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meterline_build_info"); err != nil {
		t.Fatal(err)
	}
}
