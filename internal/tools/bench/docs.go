package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Markers of the section of docs/benchmarks.md that WriteDocs rewrites.
const (
	DocsBegin = "<!-- bench:begin -->"
	DocsEnd   = "<!-- bench:end -->"
)

// docsIntro introduces the marked section when WriteDocs has to add it.
const docsIntro = `## make bench

` + "`make bench`" + ` (tools/bench, internal/tools/bench) measures, in one run against one Postgres, raw
baselines — event and outbox rows inserted with plain SQL, COPY, River working no-op jobs — and
then Tally through real HTTP against real server processes, and prints the table below: each
target is a ratio to a baseline of the same run (GitHub issue 11). It exits 1 when a target is
missed. ` + "`make bench BENCHFLAGS=--write-docs`" + ` rewrites the section between the markers.`

// WriteDocs writes the report into the markdown file at path, replacing
// whatever is between DocsBegin and DocsEnd. When the file has no markers,
// it adds a "## make bench" section holding them before the file's first
// "## " section (at the end when there is none), keeping everything else.
func WriteDocs(path string, rep *Report) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("error reading %s: %w", path, err)
	}
	updated, err := replaceSection(string(old), rep)
	if err != nil {
		return fmt.Errorf("error updating %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".benchmarks-*.md")
	if err != nil {
		return fmt.Errorf("error writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(updated); err != nil {
		tmp.Close()
		return fmt.Errorf("error writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("error writing %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("error writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("error writing %s: %w", path, err)
	}
	return nil
}

// replaceSection returns doc with the marked section holding rep.
func replaceSection(doc string, rep *Report) (string, error) {
	var body strings.Builder
	rep.Write(&body)
	block := DocsBegin + "\n" + body.String() + DocsEnd
	begin, end := strings.Index(doc, DocsBegin), strings.Index(doc, DocsEnd)
	switch {
	case begin >= 0 && end > begin:
		return doc[:begin] + block + doc[end+len(DocsEnd):], nil
	case begin >= 0 || end >= 0:
		return "", errors.New("the bench markers are incomplete or out of order: fix them by hand")
	}
	section := docsIntro + "\n\n" + block + "\n\n"
	if i := strings.Index(doc, "\n## "); i >= 0 {
		return doc[:i+1] + section + doc[i+1:], nil
	}
	if doc != "" && !strings.HasSuffix(doc, "\n\n") {
		doc = strings.TrimRight(doc, "\n") + "\n\n"
	}
	return doc + section, nil
}
