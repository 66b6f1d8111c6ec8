package redisstore

import (
	"context"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/store"
)

// pageBatch is how many ids a list reads from an index at a time when the page has no limit.
const pageBatch = 256

// fetchFunc reads the objects of ids; ok[i] is false for one to skip (gone, expired, filtered).
type fetchFunc[T any] func(ctx context.Context, ids []string) (items []T, ok []bool, err error)

// pageIndex lists one page of the objects whose ids the zset key holds, all with score 0 so that
// its lexical order is the ids' order, which is their creation order (store.Kind). It reads ids
// after the cursor in batches and keeps those fetch accepts, until the page is full and one more
// shows that more follow.
func pageIndex[T any](ctx context.Context, s *Store, key string, p store.Page, fetch fetchFunc[T]) (store.List[T], error) {
	var out store.List[T]
	batch := pageBatch
	if p.Limit > 0 {
		batch = min(p.Limit+1, pageBatch)
	}
	cursor := p.After
	for {
		args := redis.ZRangeArgs{Key: key, ByLex: true, Count: int64(batch)}
		from := "-"
		if p.Order != store.Asc {
			from = "+"
		}
		if cursor != "" {
			from = "(" + cursor
		}
		if p.Order == store.Asc {
			args.Start, args.Stop = from, "+"
		} else {
			args.Start, args.Stop, args.Rev = from, "-", true
		}
		ids, err := s.rdb.ZRangeArgs(ctx, args).Result()
		if err != nil {
			return store.List[T]{}, s.fail(ctx, err)
		}
		if len(ids) == 0 {
			return out, nil
		}
		items, ok, err := fetch(ctx, ids)
		if err != nil {
			return store.List[T]{}, err
		}
		for i := range ids {
			if !ok[i] {
				continue
			}
			if p.Limit > 0 && len(out.Items) == p.Limit {
				out.HasMore = true
				return out, nil
			}
			out.Items = append(out.Items, items[i])
		}
		if len(ids) < batch {
			return out, nil
		}
		cursor = ids[len(ids)-1]
	}
}

// pageSorted lists one page of items, which are sorted by id.
func pageSorted[T any](items []T, id func(T) string, p store.Page) store.List[T] {
	var out store.List[T]
	if p.Order != store.Asc {
		items = slices.Clone(items)
		slices.Reverse(items)
	}
	for _, it := range items {
		if p.After != "" && ((p.Order == store.Asc && id(it) <= p.After) || (p.Order != store.Asc && id(it) >= p.After)) {
			continue
		}
		if p.Limit > 0 && len(out.Items) == p.Limit {
			out.HasMore = true
			break
		}
		out.Items = append(out.Items, it)
	}
	return out
}
