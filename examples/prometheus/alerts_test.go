package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every metric the alerting rules read is one pgoutbox exports: its name,
// less the exporter's suffixes (_total for counters, _seconds for the
// unit s, _bucket, _count and _sum of histograms), is an instrument's name
// in pgoutbox's code with its dots made underscores. promtool checks the
// rules' syntax and behaviour (alerts_test.yml); this checks they would
// ever see data.
func TestAlertRulesReadMetricsPgoutboxExports(t *testing.T) {
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	instruments := map[string]bool{}
	instrument := regexp.MustCompile(`"(pgoutbox\.[a-z_.]+)"`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "examples" || d.Name() == "bench") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range instrument.FindAllStringSubmatch(string(src), -1) {
			instruments[strings.ReplaceAll(m[1], ".", "_")] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(instruments) < 20 {
		t.Fatalf("found only %d instruments in pgoutbox's code: %v", len(instruments), instruments)
	}
	used := regexp.MustCompile(`\bpgoutbox_[a-z_]+`).FindAllString(string(rules), -1)
	if len(used) == 0 {
		t.Fatal("the rules read no pgoutbox metric")
	}
	for _, name := range used {
		base := name
		for _, suffix := range []string{"_bucket", "_count", "_sum", "_seconds", "_total"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if !instruments[base] {
			t.Errorf("alerts.yml reads %s, but pgoutbox has no instrument %s", name, strings.ReplaceAll(base, "_", "."))
		}
	}
}
