// Package docscheck keeps README.md and docs/ true to the code. Its tests
// read every code block of the documentation and require each shell block to
// carry an annotation saying how it is checked, then check it: blocks marked
// "run" are run against the real Kafka and ClickHouse of `make test` (or
// `make docs-check`), and the others must name a test that exists, a file
// that runs them, or tests and packages that exist. A shell block that is
// neither run nor tied to a test fails. docs/testing.md ("The docs check")
// lists the annotations.
//
// The package has no code outside its tests.
package docscheck
