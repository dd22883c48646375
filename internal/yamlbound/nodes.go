package yamlbound

// NodesPast returns the line (from 1) by which the YAML (or JSON) text b
// is found to hold more than limit nodes in its first document, 0 if it
// is not. It counts, in
// one pass over the bytes and allocating nothing, a lower bound of the
// nodes the parser builds (aliases not expanded): one for each line of
// block content that starts a node (not blank, a comment, a document
// marker, the text of a block scalar or of a quoted or plain scalar
// continued from the line before), one for each flow collection, and one
// for each flow entry that a comma ends. yaml.v3 builds the whole node
// tree before a limit on it can be checked, at about 240 bytes a node: a
// 16 MiB flow list of 8 million one-letter items took 2 GB to refuse.
// Counting no more nodes than there are, it refuses no document that is
// within the limit; a document past it written in unusual ways (its
// nodes continued over lines as plain scalars) may pass it, to be
// refused after parsing.
func NodesPast(b []byte, limit int) int {
	s := nodeScan{limit: limit, prevIndent: -1, parent: -1}
	switch {
	case len(b) >= 2 && (b[0] == 0xfe && b[1] == 0xff || b[0] == 0xff && b[1] == 0xfe):
		return 0 // UTF-16, which the parser reads too: not counted
	case len(b) >= 3 && b[0] == 0xef && b[1] == 0xbb && b[2] == 0xbf:
		b = b[3:] // a byte order mark
	}
	for line := 1; len(b) > 0; line++ {
		end := 0
		for end < len(b) && b[end] != '\n' && b[end] != '\r' {
			end++
		}
		if s.line(b[:end]) {
			return line
		}
		if s.done || end == len(b) {
			break
		}
		if b[end] == '\r' && end+1 < len(b) && b[end+1] == '\n' {
			end++ // a line ends in \r\n, \n or \r
		}
		b = b[end+1:]
	}
	return 0
}

// nodeScan is NodesPast's state between lines.
type nodeScan struct {
	limit, nodes int
	done         bool // past the first document
	flow         int  // depth of flow collections
	quote        byte // '"' or '\'': within a quoted scalar
	// inBlock: within a block scalar, whose text is the lines indented
	// more than block (and blank ones): the indentation of the line of its
	// header, or the parent's when the header begins the line.
	inBlock bool
	block   int
	// prevIndent: the indentation of the last line of block content
	// counted; prevPlain: whether it ended in a plain scalar, which a
	// line indented more continues, or, when the scalar was all the line
	// held (bare: the value of a key on a line above, or the document
	// itself), a line indented more than parent, the line counted before
	// it when less indented (-1: the document's).
	prevIndent, parent int
	prevPlain, bare    bool
	// pending: a line of block content whose first node is not counted
	// yet (properties, an anchor or a tag, alone on a line are the node's
	// on the next); indent: its indentation.
	pending bool
	indent  int
	// onlyInd: the line counted holds indicators alone so far ("-",
	// "? ", properties); dangling: the last one did, whose node is then
	// on the next line if it is indented more than dangIndent.
	onlyInd, dangling bool
	dangIndent        int
	// In flow context, carried over lines: at the start of a node (after
	// an indicator), within a plain scalar, and whether the entry being
	// read was counted already (a collection).
	start, plain, counted bool
}

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

// line scans one line (without its newline); true once past the limit.
func (s *nodeScan) line(l []byte) bool {
	indent := 0
	for indent < len(l) && l[indent] == ' ' {
		indent++
	}
	blank := true
	for _, c := range l[indent:] {
		if !space(c) {
			blank = false
			break
		}
	}
	i := 0
	switch {
	case s.quote != 0:
		if i = s.quoted(l, 0); i < 0 {
			return false
		}
	case s.inBlock && (blank || indent > s.block):
		return false // the text of a block scalar
	case s.flow > 0:
		s.inBlock = false
		i = indent
	default:
		s.inBlock = false
		rest := l[indent:]
		switch {
		case blank || rest[0] == '#' || indent == 0 && rest[0] == '%':
			return false
		case indent == 0 && len(rest) >= 3 && (string(rest[:3]) == "---" || string(rest[:3]) == "...") && (len(rest) == 3 || space(rest[3])):
			if s.nodes > 0 || s.flow > 0 || rest[0] == '.' {
				s.done = true // the first document ends
				return false
			}
			s.prevPlain, i = false, 3 // a document marker
		case s.prevPlain && (!s.bare && indent > s.prevIndent || s.bare && indent > s.parent):
			return false // a plain scalar continued
		default:
			s.pending, s.indent, i = true, indent, indent
		}
		s.start, s.plain = true, false
	}
	s.onlyInd = false
	s.tokens(l, i)
	if s.onlyInd && s.flow == 0 && s.quote == 0 {
		s.dangling, s.dangIndent = true, s.indent
	}
	s.pending = false
	if s.flow == 0 && s.quote == 0 {
		s.prevPlain = s.plain
	}
	return s.nodes > s.limit
}

// quoted scans a quoted scalar from l[i], past its opening quote: the
// index after its closing quote, or -1 when it goes on past the line.
func (s *nodeScan) quoted(l []byte, i int) int {
	for ; i < len(l); i++ {
		switch c := l[i]; {
		case c == '\\' && s.quote == '"':
			i++
		case c == s.quote && s.quote == '\'' && i+1 < len(l) && l[i+1] == '\'':
			i++
		case c == s.quote:
			s.quote, s.start, s.plain = 0, false, false
			return i + 1
		}
	}
	return -1
}

// tokens scans the tokens of l from l[i].
func (s *nodeScan) tokens(l []byte, i int) {
	for i < len(l) {
		c := l[i]
		next := byte(' ')
		if i+1 < len(l) {
			next = l[i+1]
		}
		flowInd := s.flow > 0 && (c == ',' || c == '[' || c == ']' || c == '{' || c == '}')
		if s.plain {
			switch {
			case c == ':' && (space(next) || s.flow > 0 && (next == ',' || next == ']' || next == '}' || next == '[' || next == '{')):
				s.plain, s.start = false, true
			case c == '#' && i > 0 && space(l[i-1]):
				return // a comment
			case flowInd:
				s.plain = false
				continue // the indicator, read below
			}
			i++
			continue
		}
		first := false
		if s.pending && !space(c) && c != '#' && !(s.start && (c == '&' || c == '!')) {
			// The line's first node, unless it is the node of a line of
			// indicators above.
			if !s.dangling || s.indent <= s.dangIndent {
				s.nodes++
			}
			s.pending, first, s.dangling, s.onlyInd = false, true, false, true
			s.parent = -1
			if s.prevIndent < s.indent {
				s.parent = s.prevIndent
			}
			s.prevIndent = s.indent
		}
		switch {
		case space(c):
			i++
			continue
		case c == '#':
			return // a comment (yaml.v3 takes one right after a token too)
		case (c == '"' || c == '\'') && s.start:
			s.quote, s.onlyInd = c, false
			if i = s.quoted(l, i+1); i < 0 {
				return
			}
			continue
		case (c == '[' || c == '{') && (s.start || s.flow > 0):
			s.flow++
			if !first { // else counted as the line's
				s.nodes++
			}
			s.start, s.counted = true, false
		case (c == ']' || c == '}') && s.flow > 0:
			s.flow--
			s.start, s.counted = false, true
		case c == ',' && s.flow > 0:
			if !s.counted {
				s.nodes++
			}
			if s.nodes > s.limit {
				return // a long line of a flow list: no need to read on
			}
			s.start, s.counted = true, false
		case (c == '-' || c == '?') && s.start && space(next), c == ':' && (space(next) || s.flow > 0):
			s.start = true
			i++
			continue
		case (c == '|' || c == '>') && s.start && s.flow == 0:
			s.inBlock, s.block, s.onlyInd = true, s.prevIndent, false
			if first {
				s.block = s.parent
			}
			return // a block scalar's header
		case (c == '&' || c == '!' || c == '*') && s.start:
			for i+1 < len(l) && !space(l[i+1]) && !(s.flow > 0 && (l[i+1] == ',' || l[i+1] == ']' || l[i+1] == '}')) {
				i++
			}
			s.start = c != '*'
			if c != '*' {
				i++
				continue
			}
		default:
			s.plain, s.start, s.bare = true, false, first && s.flow == 0
		}
		s.onlyInd = false // a token other than an indicator
		i++
	}
}
