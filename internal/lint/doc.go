// Package lint holds checks of the source tree that go vet does not make.
// Its tests parse every Go file of the module; TestFunctionLength keeps
// each function outside tests at most 120 lines long, unless it is listed
// with the reason it may be longer (a declaration, not logic).
//
// The package has no code outside its tests.
package lint
