// hcl_inspect parses Terraform files with HashiCorp's HCL v2 parser (the one Terraform itself
// uses; Debian's golang-github-hashicorp-hcl-v2-dev) and prints what the deployment tests check
// as JSON: every block with its labels, and for every attribute the references it makes, the
// functions it calls, its object keys and the strings that evaluate with path.module alone.
// Templates named with -template are parsed as Terraform's templatefile() parses them, and
// rendered with each variable set to "tfvar-NAME".
//
// Usage: hcl_inspect [-template FILE]... FILE.tf...
// Exit status 1, with the parser's diagnostics on stderr, when any file does not parse.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

type attribute struct {
	References []string `json:"references"`
	// References inside try() or can(), which may name what is absent.
	OptionalReferences []string `json:"optional_references"`
	Calls              []string `json:"calls"`
	Keys               []string `json:"keys"`
	Strings            []string `json:"strings"`
}

type block struct {
	Type       string               `json:"type"`
	Labels     []string             `json:"labels"`
	Attributes map[string]attribute `json:"attributes"`
	Blocks     []block              `json:"blocks"`
}

type template struct {
	Path      string   `json:"path"`
	Variables []string `json:"variables"`
	Rendered  string   `json:"rendered"`
}

type output struct {
	Files     map[string][]block `json:"files"`
	Templates []template         `json:"templates"`
}

// traversalText is a reference as Terraform writes it: "var.image",
// "local.head_task.containerDefinitions[0].cpu", "aws_iam_role.task.arn".
func traversalText(t hcl.Traversal) string {
	var b strings.Builder
	for _, step := range t {
		switch s := step.(type) {
		case hcl.TraverseRoot:
			b.WriteString(s.Name)
		case hcl.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			if s.Key.Type() == cty.String {
				b.WriteString(fmt.Sprintf("[%q]", s.Key.AsString()))
			} else if s.Key.Type() == cty.Number {
				b.WriteString("[" + s.Key.AsBigFloat().Text('f', -1) + "]")
			} else {
				b.WriteString("[?]")
			}
		default:
			b.WriteString("[*]")
		}
	}
	return b.String()
}

func sortedUnique(in []string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func inspectExpression(expr hclsyntax.Expression, ctx *hcl.EvalContext) attribute {
	a := attribute{References: []string{}, OptionalReferences: []string{}, Calls: []string{},
		Keys: []string{}, Strings: []string{}}
	for _, t := range expr.Variables() {
		a.References = append(a.References, traversalText(t))
	}
	if obj, ok := expr.(*hclsyntax.ObjectConsExpr); ok {
		for _, item := range obj.Items {
			if key := hcl.ExprAsKeyword(item.KeyExpr); key != "" {
				a.Keys = append(a.Keys, key)
			} else if v, diags := item.KeyExpr.Value(nil); !diags.HasErrors() && v.Type() == cty.String {
				a.Keys = append(a.Keys, v.AsString())
			}
		}
	}
	hclsyntax.VisitAll(expr, func(n hclsyntax.Node) hcl.Diagnostics {
		switch e := n.(type) {
		case *hclsyntax.FunctionCallExpr:
			a.Calls = append(a.Calls, e.Name)
			if e.Name == "try" || e.Name == "can" {
				for _, arg := range e.Args {
					for _, t := range arg.Variables() {
						a.OptionalReferences = append(a.OptionalReferences, traversalText(t))
					}
				}
			}
		case *hclsyntax.TemplateExpr:
			if v, diags := e.Value(ctx); !diags.HasErrors() && v.IsWhollyKnown() && v.Type() == cty.String {
				a.Strings = append(a.Strings, v.AsString())
			}
		}
		return nil
	})
	a.References = sortedUnique(a.References)
	a.OptionalReferences = sortedUnique(a.OptionalReferences)
	return a
}

func inspectBody(body *hclsyntax.Body, ctx *hcl.EvalContext) ([]block, map[string]attribute) {
	attrs := map[string]attribute{}
	for name, attr := range body.Attributes {
		attrs[name] = inspectExpression(attr.Expr, ctx)
	}
	blocks := []block{}
	for _, b := range body.Blocks {
		nested, nestedAttrs := inspectBody(b.Body, ctx)
		labels := b.Labels
		if labels == nil {
			labels = []string{}
		}
		blocks = append(blocks, block{Type: b.Type, Labels: labels, Attributes: nestedAttrs, Blocks: nested})
	}
	return blocks, attrs
}

func main() {
	parser := hclparse.NewParser()
	out := output{Files: map[string][]block{}, Templates: []template{}}
	var diags hcl.Diagnostics
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		if args[i] == "-template" && i+1 < len(args) {
			i++
			src, err := os.ReadFile(args[i])
			if err != nil {
				fmt.Fprintf(os.Stderr, "hcl_inspect: cannot read the template %s: %v\n", args[i], err)
				os.Exit(2)
			}
			expr, d := hclsyntax.ParseTemplate(src, args[i], hcl.Pos{Line: 1, Column: 1, Byte: 0})
			diags = append(diags, d...)
			if d.HasErrors() {
				continue
			}
			vars := map[string]cty.Value{}
			names := []string{}
			for _, t := range expr.Variables() {
				if _, seen := vars[t.RootName()]; !seen {
					names = append(names, t.RootName())
				}
				vars[t.RootName()] = cty.StringVal("tfvar-" + t.RootName())
			}
			sort.Strings(names)
			v, d := expr.Value(&hcl.EvalContext{Variables: vars})
			diags = append(diags, d...)
			rendered := ""
			if !d.HasErrors() && v.Type() == cty.String {
				rendered = v.AsString()
			}
			out.Templates = append(out.Templates, template{Path: args[i], Variables: names, Rendered: rendered})
			continue
		}
		file, d := parser.ParseHCLFile(args[i])
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		dir, _ := filepath.Abs(filepath.Dir(args[i]))
		ctx := &hcl.EvalContext{Variables: map[string]cty.Value{
			"path": cty.ObjectVal(map[string]cty.Value{"module": cty.StringVal(dir)}),
		}}
		blocks, attrs := inspectBody(file.Body.(*hclsyntax.Body), ctx)
		if len(attrs) > 0 {
			names := []string{}
			for name := range attrs {
				names = append(names, name)
			}
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Attributes outside any block: " + strings.Join(names, ", "),
				Subject:  &hcl.Range{Filename: args[i]},
			})
		}
		out.Files[args[i]] = blocks
	}
	if diags.HasErrors() {
		wr := hcl.NewDiagnosticTextWriter(os.Stderr, parser.Files(), 100, false)
		wr.WriteDiagnostics(diags)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "hcl_inspect:", err)
		os.Exit(2)
	}
}
