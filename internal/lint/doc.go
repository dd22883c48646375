// Package lint holds checks of the source tree that go vet does not make.
// Its tests parse every Go file of the module; TestFunctionLength keeps
// each function outside tests at most 120 lines long, unless it is listed
// with the reason it may be longer (a declaration, not logic), and
// TestExportedFunctionDocs requires the doc comment of each exported
// function outside tests to begin with its name, and
// TestMessagesCiteNoMissingDocument requires the strings outside tests
// (errors, log lines, help), and TestCommentsCiteNoMissingDocument the
// comments of every Go file, to cite files and headings of docs/ that
// exist, never sections of a design document or other documents that are
// not in the repository.
//
// The package has no code outside its tests.
package lint
