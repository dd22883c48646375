// Package lint holds checks of the source tree that go vet does not make.
// Its tests parse every Go file of the module; TestFunctionLength keeps
// each function outside tests at most 120 lines long, unless it is listed
// with the reason it may be longer (a declaration, not logic), and
// TestExportedFunctionDocs requires the doc comment of each exported
// function outside tests to begin with its name.
//
// The package has no code outside its tests.
package lint
