// Package clickhouse holds Meterline's ClickHouse DDL as numbered
// migrations (docs/design.md, The ClickHouse ledger): files NNN_name.sql in
// this directory, embedded in the binary. sink.Migrate applies them.
//
// A migration is one or more statements, each ended by a semicolon at the
// end of a line. Lines starting with "--" are comments. Every statement
// must be safe to run again (CREATE TABLE IF NOT EXISTS, ...): a migration
// interrupted half-way is re-run from its first statement. ClickHouse 18.16
// has no IF [NOT] EXISTS on ALTER ... COLUMN, so an ALTER TABLE of a
// migration is made of ADD COLUMN clauses and at most a MODIFY ORDER BY:
// the migrator counts it as applied when it fails because every column it
// adds is there already with its type, and the sort key is the one it
// sets. One ALTER applies all its clauses or none; a migration may hold
// several.
//
// Applied migrations are never edited: the migrator records each one's
// checksum and refuses to run when an applied file has changed.
package clickhouse

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

//go:embed *.sql
var files embed.FS

// Migration is one numbered DDL file.
type Migration struct {
	Version    int      // NNN of the file name, from 1, without gaps
	Name       string   // the file name, "001_tables.sql"
	Statements []string // in file order, without the trailing semicolons
	Checksum   string   // SHA-256 of the file, hex
}

var fileName = regexp.MustCompile(`^([0-9]{3})_[a-z0-9_]+\.sql$`)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	return Parse(files)
}

// Parse reads the migrations of a directory (the embedded one, or a test's).
func Parse(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("clickhouse migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("clickhouse migrations: %s: want NNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("clickhouse migrations: %w", err)
		}
		stmts := Split(string(b))
		if len(stmts) == 0 {
			return nil, fmt.Errorf("clickhouse migrations: %s has no statement", e.Name())
		}
		sum := sha256.Sum256(b)
		out = append(out, Migration{Version: v, Name: e.Name(), Statements: stmts, Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("clickhouse migrations: %s: version %d, want %d (numbered from 001 without gaps or repeats)", m.Name, m.Version, i+1)
		}
	}
	return out, nil
}

// Split cuts a migration file into statements: comment lines are dropped,
// and a statement ends with a semicolon at the end of a line.
func Split(sql string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		if strings.HasSuffix(t, ";") {
			cur.WriteString(strings.TrimSuffix(strings.TrimRight(line, " \t\r"), ";"))
			if s := strings.TrimSpace(cur.String()); s != "" {
				out = append(out, s)
			}
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
