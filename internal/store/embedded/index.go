package embedded

import (
	"slices"

	"github.com/ciproxy/ciproxy/internal/store"
)

// index is a sorted set of ids. Ids of one kind sort by creation (store.Kind), so the index is the
// list order and a cursor is a position in it.
type index []string

func (ix *index) add(id string) {
	i, found := slices.BinarySearch(*ix, id)
	if !found {
		*ix = slices.Insert(*ix, i, id)
	}
}

func (ix *index) remove(id string) {
	if i, found := slices.BinarySearch(*ix, id); found {
		*ix = slices.Delete(*ix, i, i+1)
	}
}

// page walks ix in p's order from p's cursor and collects the values that get returns with ok
// true (the rest are skipped: filtered out, expired), up to p.Limit, reporting whether another
// would follow.
func page[T any](ix index, p store.Page, get func(id string) (T, bool)) store.List[T] {
	var out store.List[T]
	take := func(id string) bool { // reports whether to go on
		v, ok := get(id)
		if !ok {
			return true
		}
		if p.Limit > 0 && len(out.Items) == p.Limit {
			out.HasMore = true
			return false
		}
		out.Items = append(out.Items, v)
		return true
	}
	if p.Order == store.Asc {
		start := 0
		if p.After != "" {
			start, _ = slices.BinarySearch(ix, p.After)
			if start < len(ix) && ix[start] == p.After {
				start++
			}
		}
		for _, id := range ix[start:] {
			if !take(id) {
				break
			}
		}
		return out
	}
	end := len(ix)
	if p.After != "" {
		end, _ = slices.BinarySearch(ix, p.After) // everything before it is smaller
	}
	for i := end - 1; i >= 0; i-- {
		if !take(ix[i]) {
			break
		}
	}
	return out
}
