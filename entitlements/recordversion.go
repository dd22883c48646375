package entitlements

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/meterline/meterline/internal/clip"
)

// RecordVersion names a customer's record by where it is in usage.entitlements:
// its partition and offset, written "3/1842". `entitlements get` prints
// the version of the record it shows; `set` with that version in the
// document (or `delete --expect-version`) writes only while the record
// is still the customer's latest (docs/entitlements.md, Two writers of
// one record).
type RecordVersion struct {
	Partition int32
	Offset    int64
}

// String returns the version as documents hold it: "partition/offset".
func (v RecordVersion) String() string { return fmt.Sprintf("%d/%d", v.Partition, v.Offset) }

// ParseRecordVersion reads a version written "partition/offset", each a
// non-negative decimal integer.
func ParseRecordVersion(s string) (RecordVersion, error) {
	p, o, ok := strings.Cut(s, "/")
	pv, perr := strconv.ParseInt(p, 10, 32)
	ov, oerr := strconv.ParseInt(o, 10, 64)
	if !ok || perr != nil || oerr != nil || pv < 0 || ov < 0 || strings.HasPrefix(p, "+") || strings.HasPrefix(o, "+") {
		return RecordVersion{}, fmt.Errorf("not a version such as 3/1842 (partition/offset, as `meterline entitlements get` prints it) (%q)",
			clip.To(s, clip.Echo))
	}
	return RecordVersion{Partition: int32(pv), Offset: ov}, nil
}
