package intercept

import (
	"bytes"
	"errors"
	"net/url"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// This file is the translator's citations: the container_file_citation annotations OpenAI puts
// on the output_text of an assistant message, one per sandbox:/mnt/data/... link to a container
// file (the span covering the link's URL), and one at 0..0 for an image the response's code
// wrote that no message has cited yet. They are computed once per text part, when its text is
// complete (output_text.done, or whichever of content_part.done and output_item.done comes
// first), so both renderings carry the same annotations: the stream announces each with
// response.output_text.annotation.added just before output_text.done, and the done events and
// the final Response include them.

// sandboxLink is the start of a link to a file in the container.
const sandboxLink = "sandbox:" + sandbox.DataDir + "/"

// citation is a container_file_citation annotation, keys in the order OpenAI sends them.
type citation struct {
	Type        string `json:"type"`
	ContainerID string `json:"container_id"`
	EndIndex    int    `json:"end_index"`
	FileID      string `json:"file_id"`
	Filename    string `json:"filename"`
	StartIndex  int    `json:"start_index"`
}

// annotationAddedEvent is response.output_text.annotation.added.
type annotationAddedEvent struct {
	head
	ItemID          string   `json:"item_id"`
	OutputIndex     int      `json:"output_index"`
	ContentIndex    int      `json:"content_index"`
	AnnotationIndex int      `json:"annotation_index"`
	Annotation      citation `json:"annotation"`
}

const evAnnotationAdded = "response.output_text.annotation.added"

func (e annotationAddedEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

// link is one sandbox:/mnt/data/... URL in a text, by byte offsets.
type link struct {
	start, end int
	path       string // the absolute path it names, cleaned
}

// findLinks returns the sandbox links of text. A link inside a markdown link's parentheses
// runs to the closing parenthesis (names may hold spaces); a bare one to the first space,
// quote, bracket or backtick, without trailing punctuation. Percent escapes are decoded.
func findLinks(text string) []link {
	var out []link
	for from := 0; ; {
		i := strings.Index(text[from:], sandboxLink)
		if i < 0 {
			return out
		}
		start := from + i
		end := start + len(sandboxLink)
		inParens := start >= 2 && text[start-2:start] == "]("
		for end < len(text) {
			c := text[end]
			if c == '\n' || c == '\r' || c == ')' || (!inParens && strings.IndexByte(" \t\"'<>[]`", c) >= 0) {
				break
			}
			end++
		}
		if !inParens {
			for end > start+len(sandboxLink) && strings.IndexByte(".,;:!?", text[end-1]) >= 0 {
				end--
			}
		}
		from = end
		raw := strings.TrimSpace(text[start+len("sandbox:") : end])
		if p, err := url.PathUnescape(raw); err == nil {
			raw = p
		}
		p := path.Clean(raw)
		if !strings.HasPrefix(p, sandbox.DataDir+"/") {
			continue
		}
		out = append(out, link{start: start, end: end, path: p})
	}
}

// runeIndex converts a byte offset in s to the index OpenAI reports, in characters (code
// points) from the start.
func runeIndex(s string, off int) int { return utf8.RuneCountInString(s[:off]) }

// isImage reports whether a container file is an image, by its name.
func isImage(p string) bool {
	switch strings.ToLower(path.Ext(p)) {
	case ".png", ".jpg", ".jpeg", ".gif", ".webp":
		return true
	}
	return false
}

// addFiles makes container files known to the citations: placed ones, or (written) ones the
// code wrote, whose images are cited by the next message if it does not link them.
func (t *translator) addFiles(files []store.ContainerFile, written bool) {
	if t.files == nil {
		t.files = map[string]store.ContainerFile{}
	}
	for _, f := range files {
		t.files[f.Path] = f
		if !written || !isImage(f.Path) {
			continue
		}
		t.uncited = removeFile(t.uncited, f.Path)
		t.uncited = append(t.uncited, f)
	}
}

// setAllFiles hands over every file of the container (the loop read them when a message linked
// a file this request had not seen).
func (t *translator) setAllFiles(files []store.ContainerFile) {
	for _, f := range files {
		if _, ok := t.files[f.Path]; !ok {
			t.addFiles([]store.ContainerFile{f}, false)
		}
	}
	t.filesKnown = true
}

func removeFile(files []store.ContainerFile, p string) []store.ContainerFile {
	out := files[:0]
	for _, f := range files {
		if f.Path != p {
			out = append(out, f)
		}
	}
	return out
}

// errNeedFiles is event's answer to an event whose text links a file the translator does not
// know while it does not know every file of the container. Nothing of the event was taken: the
// loop hands the container's files over (setAllFiles) and feeds the same event again.
var errNeedFiles = errors.New("intercept: a message links a container file; the container's files are needed")

// needsFiles reports whether an event completes a text that links a file not known yet.
func (t *translator) needsFiles(typ string, data []byte) bool {
	if t.filesKnown || !t.req.sandboxed() || !bytes.Contains(data, []byte(sandboxLink)) {
		return false
	}
	unknown := func(text string) bool {
		for _, l := range findLinks(text) {
			if _, ok := t.files[l.path]; !ok {
				return true
			}
		}
		return false
	}
	inItem := func(item gjson.Result) bool {
		found := false
		if item.Get("type").String() == "message" {
			item.Get("content").ForEach(func(_, p gjson.Result) bool {
				found = p.Get("type").String() == "output_text" && unknown(p.Get("text").String())
				return !found
			})
		}
		return found
	}
	switch typ {
	case "response.output_text.done":
		return unknown(gjson.GetBytes(data, "text").String())
	case "response.content_part.done":
		return unknown(gjson.GetBytes(data, "part.text").String())
	case "response.output_item.done":
		return inItem(gjson.GetBytes(data, "item"))
	}
	if _, ok := terminalOutcome(typ); ok {
		found := false
		gjson.GetBytes(data, "response.output").ForEach(func(_, it gjson.Result) bool {
			found = inItem(it)
			return !found
		})
		return found
	}
	return false
}

// cite returns the citations of a finished text: its links to known container files, then the
// images not cited yet, which it cites.
func (t *translator) cite(text string) []citation {
	var out []citation
	for _, l := range findLinks(text) {
		f, ok := t.files[l.path]
		if !ok {
			continue
		}
		out = append(out, citation{Type: "container_file_citation", ContainerID: f.ContainerID, FileID: f.ID,
			Filename: path.Base(f.Path), StartIndex: runeIndex(text, l.start), EndIndex: runeIndex(text, l.end)})
		t.uncited = removeFile(t.uncited, f.Path)
	}
	for _, f := range t.uncited {
		// As OpenAI names an image it cites without a link: the file id and the extension.
		out = append(out, citation{Type: "container_file_citation", ContainerID: f.ContainerID, FileID: f.ID,
			Filename: f.ID + strings.ToLower(path.Ext(f.Path))})
	}
	t.uncited = t.uncited[:0]
	return out
}

// citedPart is what the translator knows of one output_text part of a passed message.
type citedPart struct {
	cited    bool
	cites    []citation
	upstream int // annotations the upstream announced for the part (annotation.added passed)
}

// part returns the state of content part ci of message slot s.
func (s *slot) part(ci int) *citedPart {
	for len(s.parts) <= ci {
		s.parts = append(s.parts, &citedPart{})
	}
	return s.parts[ci]
}

// citePart computes the citations of content part ci of message slot s once, from its finished
// text, and returns the annotation.added events that announce them.
func (t *translator) citePart(s *slot, ci int, text string) []Event {
	p := s.part(ci)
	if p.cited {
		return nil
	}
	p.cited = true
	if !t.req.sandboxed() {
		return nil
	}
	p.cites = t.cite(text)
	evs := make([]Event, 0, len(p.cites))
	for i, c := range p.cites {
		evs = append(evs, Event{Type: evAnnotationAdded, minted: annotationAddedEvent{
			head: head{Type: evAnnotationAdded}, ItemID: s.upID, OutputIndex: s.index, ContentIndex: ci,
			AnnotationIndex: p.upstream + i, Annotation: c,
		}})
	}
	return evs
}

// withCitations returns an output_text part with the part's citations appended to its
// annotations.
func withCitations(part []byte, p *citedPart) []byte {
	if p == nil || len(p.cites) == 0 {
		return part
	}
	anns := []byte{'['}
	gjson.GetBytes(part, "annotations").ForEach(func(_, a gjson.Result) bool {
		anns = appendElem(anns, []byte(a.Raw))
		return true
	})
	for _, c := range p.cites {
		anns = appendElem(anns, marshal(c))
	}
	anns = append(anns, ']')
	out, err := sjson.SetRawBytes(part, "annotations", anns)
	if err != nil {
		return part
	}
	return out
}

// citeMessage cites every output_text part of a finished message item not cited yet and returns
// the item with its citations, and the events announcing those cited now.
func (t *translator) citeMessage(s *slot, item []byte) ([]byte, []Event) {
	it := gjson.ParseBytes(item)
	if it.Get("type").String() != "message" {
		return item, nil
	}
	var evs []Event
	changed := false
	out := item
	it.Get("content").ForEach(func(k, p gjson.Result) bool {
		if p.Get("type").String() != "output_text" {
			return true
		}
		ci := int(k.Int())
		evs = append(evs, t.citePart(s, ci, p.Get("text").String())...)
		if tp := s.part(ci); len(tp.cites) > 0 {
			if o, err := sjson.SetRawBytes(out, "content."+strconv.Itoa(ci), withCitations([]byte(p.Raw), tp)); err == nil {
				out = o
				changed = true
			}
		}
		return true
	})
	if !changed {
		return item, evs
	}
	return out, evs
}

// textEvent handles the events of a passed message's text parts that citations change: the
// annotations are announced before output_text.done (or, for a server that skips it, before
// content_part.done), and content_part.done carries them.
func (t *translator) textEvent(typ string, data []byte) ([]Event, bool) {
	s := t.byID[gjson.GetBytes(data, "item_id").String()]
	if oi := gjson.GetBytes(data, "output_index"); s == nil && oi.Exists() && int(oi.Int()) < len(t.slots) {
		s = t.slots[oi.Int()]
	}
	if s == nil || s.ours {
		return nil, false
	}
	ci := int(gjson.GetBytes(data, "content_index").Int())
	evs := t.announce()
	switch typ {
	case evAnnotationAdded:
		s.part(ci).upstream++
	case "response.output_text.done":
		evs = append(evs, t.citePart(s, ci, gjson.GetBytes(data, "text").String())...)
	case "response.content_part.done":
		part := gjson.GetBytes(data, "part")
		if part.Get("type").String() == "output_text" {
			evs = append(evs, t.citePart(s, ci, part.Get("text").String())...)
			if tp := s.part(ci); len(tp.cites) > 0 {
				if out, err := sjson.SetRawBytes(data, "part", withCitations([]byte(part.Raw), tp)); err == nil {
					data = out
				}
			}
		}
	}
	return append(evs, t.pass(data)), true
}
