package service

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is the release this binary was built as, set at link time
// (`make build`: -X with `git describe --tags --always --dirty`). Empty:
// the module version or VCS revision the Go toolchain recorded stands in.
var version string

// Build says what this binary is: the version it was built as, the VCS
// revision (with "-modified" for a tree with uncommitted changes) and the
// Go toolchain.
type Build struct {
	Version, Revision, GoVersion string
}

// BuildOf returns the build of this binary: Version from the link-time
// version, else the module version ("(devel)" when neither says more);
// Revision from the VCS stamp the toolchain recorded, when it did.
func BuildOf() Build { return buildOf(version, debug.ReadBuildInfo) }

func buildOf(linked string, read func() (*debug.BuildInfo, bool)) Build {
	b := Build{Version: linked, GoVersion: runtime.Version()}
	bi, ok := read()
	if !ok {
		bi = &debug.BuildInfo{}
	}
	if b.Version == "" {
		b.Version = bi.Main.Version
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if len(b.Revision) > 12 {
		b.Revision = b.Revision[:12]
	}
	if modified && b.Revision != "" {
		b.Revision += "-modified"
	}
	return b
}

// String is what `meterline version` prints after the name.
func (b Build) String() string {
	s := b.Version
	if b.Revision != "" {
		s += " (revision " + b.Revision + ")"
	}
	return s + " " + b.GoVersion
}

// newBuildInfo is meterline_build_info: 1, labelled with the build, so
// that a dashboard or an alert can tell which build each process runs.
func newBuildInfo(b Build) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "meterline_build_info",
		Help:        "Always 1; its labels say which build the process runs: version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion}})
	g.Set(1)
	return g
}
