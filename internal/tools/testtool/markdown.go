package testtool

import "strings"

// MarkdownSections returns the sections of the markdown document doc by the
// anchor GitHub gives their heading (MarkdownAnchor). A section runs from
// its heading to the next heading of the same or a higher level, so it
// holds its subsections. Lines in fenced code blocks are never headings (a
// shell comment is not one). A heading repeated keeps its first section
// (GitHub numbers the others, -1, -2, …).
func MarkdownSections(doc string) map[string]string {
	type open struct {
		anchor string
		level  int
		lines  []string
	}
	sections := map[string]string{}
	var stack []*open
	closeTo := func(level int) {
		for len(stack) > 0 && stack[len(stack)-1].level >= level {
			s := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if _, ok := sections[s.anchor]; !ok {
				sections[s.anchor] = strings.Join(s.lines, "\n")
			}
		}
	}
	fenced := false
	for line := range strings.SplitSeq(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if heading, ok := strings.CutPrefix(line[level:], " "); ok && level > 0 && !fenced {
			closeTo(level)
			stack = append(stack, &open{anchor: MarkdownAnchor(heading), level: level})
		}
		for _, s := range stack {
			s.lines = append(s.lines, line)
		}
	}
	closeTo(1)
	return sections
}

// MarkdownAnchor is the anchor GitHub gives a markdown heading: lower case,
// spaces to hyphens, punctuation other than - and _ dropped.
func MarkdownAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
