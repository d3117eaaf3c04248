package main

import (
	"fmt"
	"strings"
)

// diffLine is one line of a line diff: op ' ' is in both texts, '-' only
// in the first, '+' only in the second.
type diffLine struct {
	op   byte
	text string
}

// lines splits text into lines without their newlines.
func lines(text string) []string {
	if text == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(text, "\n"), "\n")
}

// lineDiff is a shortest edit from a to b: the lines outside a longest
// common subsequence of the two. It takes time and memory len(a)*len(b),
// which the few dozen lines of a resource afford.
func lineDiff(a, b []string) []diffLine {
	// lcs[i][j] is the length of a longest common subsequence of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []diffLine
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			out = append(out, diffLine{' ', a[i]})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			// Removals before additions, as diff -u shows them.
			out = append(out, diffLine{'-', a[i]})
			i++
		default:
			out = append(out, diffLine{'+', b[j]})
			j++
		}
	}
	return out
}

// unified renders d as diff -u hunks: the changed lines with up to
// context unchanged lines around them, under "@@ -l,n +l,n @@" headers.
func unified(d []diffLine, context int) string {
	// before[k] and after[k] count the lines of each text ahead of d[k].
	before, after := make([]int, len(d)+1), make([]int, len(d)+1)
	for k, l := range d {
		before[k+1], after[k+1] = before[k], after[k]
		if l.op != '+' {
			before[k+1]++
		}
		if l.op != '-' {
			after[k+1]++
		}
	}
	var b strings.Builder
	for k := 0; k < len(d); {
		if d[k].op == ' ' {
			k++
			continue
		}
		// A hunk starts context lines before a change and runs on while the
		// next change is near enough for the contexts to touch.
		start, end := max(k-context, 0), k
		for m := k; m < len(d) && m <= end+2*context+1; m++ {
			if d[m].op != ' ' {
				end = m
			}
		}
		end = min(end+context+1, len(d))
		fmt.Fprintf(&b, "@@ -%s +%s @@\n", hunkRange(before[start], before[end]), hunkRange(after[start], after[end]))
		for _, l := range d[start:end] {
			b.WriteByte(l.op)
			b.WriteString(l.text)
			b.WriteByte('\n')
		}
		k = end
	}
	return b.String()
}

// hunkRange is "first,count" of the lines from index from to index to, as
// diff -u numbers them: from 1, the count left out when 1, and an empty
// range named by the line before it.
func hunkRange(from, to int) string {
	switch n := to - from; n {
	case 0:
		return fmt.Sprintf("%d,0", from)
	case 1:
		return fmt.Sprint(from + 1)
	default:
		return fmt.Sprintf("%d,%d", from+1, n)
	}
}
