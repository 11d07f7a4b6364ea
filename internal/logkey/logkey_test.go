package logkey_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// logMethods are slog.Logger's methods that take key-value pairs, with the
// index of the first pair: after the message, and the context before it.
var logMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "With": 0,
}

// attrFuncs are slog's constructors of one attribute, key first.
var attrFuncs = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true,
	"Bool": true, "Time": true, "Duration": true, "Any": true, "Group": true,
}

// TestKeysAreConstants walks Switchboard's sources and fails on a string
// literal used as a key in a slog call (a Logger's methods, slog's
// attribute constructors, and a package's own helpers that pass
// "args ...any" on to one): keys are this package's constants.
func TestKeysAreConstants(t *testing.T) {
	roots := []string{"..", "../../cmd"}
	// A first walk finds the helpers other packages may call, such as
	// lograte's: methods that take a Logger, then a message and pairs.
	shared := map[string]int{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() == "testdata" {
				return err
			}
			for _, pkg := range parseDir(t, path) {
				for name, i := range loggerHelpers(pkg) {
					shared[name] = i
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	checked := 0
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() == "testdata" {
				return err
			}
			checked += checkDir(t, path, shared)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 50 {
		t.Errorf("only %d log calls found: is the walk still over internal/ and cmd/?", checked)
	}
}

// checkDir checks the non-test files of one package and returns the log
// calls it found.
func checkDir(t *testing.T, dir string, shared map[string]int) int {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, pkg := range pkgs {
		helpers := logHelpers(pkg)
		for name, i := range shared {
			if _, own := helpers[name]; !own {
				helpers[name] = i
			}
		}
		for _, f := range pkg.Files {
			imported := importNames(f)
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				first, ok := pairsStart(call, imported, helpers)
				if !ok {
					return true
				}
				calls++
				for _, key := range keys(call.Args, first) {
					if lit, ok := key.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						t.Errorf("%s: log key %s is a string literal; use a logkey constant", fset.Position(lit.Pos()), lit.Value)
					}
				}
				return true
			})
		}
	}
	return calls
}

// pairsStart returns the index of call's first key when call logs.
func pairsStart(call *ast.CallExpr, imported map[string]bool, helpers map[string]int) (int, bool) {
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		i, ok := helpers[fn.Name]
		return i, ok
	case *ast.SelectorExpr:
		if x, ok := fn.X.(*ast.Ident); ok && imported[x.Name] {
			// A package's function: only slog's constructors of an attribute.
			return 0, x.Name == "slog" && attrFuncs[fn.Sel.Name] && len(call.Args) > 0
		}
		if i, ok := helpers[fn.Sel.Name]; ok {
			return i, true
		}
		i, ok := logMethods[fn.Sel.Name]
		return i, ok && len(call.Args) >= i
	}
	return 0, false
}

// keys returns the keys among args[first:]: every other argument, except
// an attribute built in place, which is one argument with its key first.
func keys(args []ast.Expr, first int) []ast.Expr {
	var out []ast.Expr
	if first == 0 && len(args) > 0 {
		if attr, ok := attrCall(args[0]); ok {
			return []ast.Expr{attr.Args[0]}
		}
	}
	for i := first; i < len(args); i++ {
		if attr, ok := attrCall(args[i]); ok {
			out = append(out, attr.Args[0])
			continue
		}
		out = append(out, args[i])
		i++ // the value
	}
	return out
}

func attrCall(e ast.Expr) (*ast.CallExpr, bool) {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return nil, false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil, false
	}
	x, ok := sel.X.(*ast.Ident)
	return call, ok && x.Name == "slog" && attrFuncs[sel.Sel.Name]
}

// logHelpers finds a package's functions and methods whose last parameter
// is "args ...any" after a message string: wrappers that hand their pairs
// to a Logger, keyed by name, with the index of the pairs.
func logHelpers(pkg *ast.Package) map[string]int {
	helpers := map[string]int{}
	for _, f := range pkg.Files {
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Type.Params == nil {
				continue
			}
			var params []*ast.Field
			for _, p := range fd.Type.Params.List {
				for range max(1, len(p.Names)) {
					params = append(params, p)
				}
			}
			n := len(params)
			if n < 2 || !isVariadicAny(params[n-1].Type) || !isIdent(params[n-2].Type, "string") {
				continue
			}
			if names := params[n-2].Names; len(names) > 0 && names[len(names)-1].Name == "format" {
				continue // a printf-like function: its arguments are no pairs
			}
			helpers[fd.Name.Name] = n - 1
		}
	}
	return helpers
}

// parseDir parses the non-test files of one directory.
func parseDir(t *testing.T, dir string) map[string]*ast.Package {
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// loggerHelpers finds the methods among a package's log helpers (see
// logHelpers) that take the Logger to write to as their first parameter,
// such as lograte's InfoTo: other packages call them too. Their names
// must not be a Logger's own methods', whose pairs start elsewhere.
func loggerHelpers(pkg *ast.Package) map[string]int {
	out := map[string]int{}
	helpers := logHelpers(pkg)
	for _, f := range pkg.Files {
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || !ast.IsExported(fd.Name.Name) || len(fd.Type.Params.List) == 0 {
				continue
			}
			i, ok := helpers[fd.Name.Name]
			if _, slogs := logMethods[fd.Name.Name]; !ok || slogs {
				continue
			}
			if star, ok := fd.Type.Params.List[0].Type.(*ast.StarExpr); ok {
				if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "Logger" {
					out[fd.Name.Name] = i
				}
			}
		}
	}
	return out
}

func isVariadicAny(e ast.Expr) bool {
	el, ok := e.(*ast.Ellipsis)
	return ok && isIdent(el.Elt, "any")
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func importNames(f *ast.File) map[string]bool {
	names := map[string]bool{}
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		names[name] = true
	}
	return names
}
