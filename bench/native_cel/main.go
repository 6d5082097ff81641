// Times each CEL expression of gpu-webhook's native policies, one at a time, with kube-apiserver's CEL libraries
// (k8s.io/apiserver v0.36.3, the release the e2e control plane runs) and the variables evaluated before it
// precomputed. Input: the JSON that bench/native_cel_micro.py writes. Not the API server's whole cost per
// request (the activations, the object's conversion, the JSONPatch): only what the expressions themselves cost.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"k8s.io/apiserver/pkg/cel/library"
)

type run struct {
	Name   string         `json:"name"`
	Object map[string]any `json:"object"`
	Conds  []string       `json:"conds"`
	Vars   [][2]string    `json:"vars"`
	Exprs  []string       `json:"exprs"`
}

func main() {
	raw, _ := os.ReadFile(os.Args[1])
	var in struct {
		Params map[string]any `json:"params"`
		Runs   []run          `json:"runs"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		panic(err)
	}
	env, err := cel.NewEnv(cel.Variable("params", cel.DynType), cel.Variable("variables", cel.DynType),
		cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType), cel.Variable("request", cel.DynType),
		cel.HomogeneousAggregateLiterals(), cel.OptionalTypes(), cel.CrossTypeNumericComparisons(true),
		ext.Strings(ext.StringsVersion(2)), ext.Lists(), ext.Sets(), library.Quantity(), library.Lists(), library.Regex(),
		library.URLs())
	if err != nil {
		panic(err)
	}
	n := 2000 // evaluations per expression
	time1 := func(expr string, act map[string]any) (any, float64) {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			panic(fmt.Sprintf("%v: %s", iss.Err(), expr[:80]))
		}
		prg, err := env.Program(ast, cel.InterruptCheckFrequency(100))
		if err != nil {
			panic(err)
		}
		out, _, err := prg.Eval(act)
		if err != nil {
			return "ERR " + err.Error(), 0
		}
		start := time.Now()
		for i := 0; i < n; i++ {
			prg.Eval(act)
		}
		return out.Value(), float64(time.Since(start).Nanoseconds()) / float64(n) / 1000
	}
	for _, r := range in.Runs {
		vars := map[string]any{}
		act := map[string]any{"params": in.Params, "variables": vars, "object": r.Object, "oldObject": nil,
			"request": map[string]any{"operation": "CREATE", "namespace": "profile", "resource": map[string]any{"resource": "pods", "group": ""}}}
		total := 0.0
		fmt.Printf("== %s\n", r.Name)
		for i, c := range r.Conds {
			out, us := time1(c, act)
			total += us
			fmt.Printf("  cond %d  %7.1f us  -> %v\n", i, us, out)
		}
		for _, v := range r.Vars {
			out, us := time1(v[1], act)
			vars[v[0]] = out
			total += us
			s := fmt.Sprint(out)
			if len(s) > 50 {
				s = s[:50]
			}
			fmt.Printf("  var %-14s %7.1f us  -> %s\n", v[0], us, s)
		}
		for i, e := range r.Exprs {
			_, us := time1(e, act)
			total += us
			if us > 5 {
				fmt.Printf("  expr %d %7.1f us\n", i, us)
			}
		}
		fmt.Printf("  total %.1f us (each expression once, variables precomputed)\n", total)
	}
}
