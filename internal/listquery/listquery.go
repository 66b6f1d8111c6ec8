// Package listquery reads the query parameters OpenAI's list endpoints share, limit and order,
// and refuses bad values with the errors OpenAI answers, so every list of the proxy (files,
// containers, container files, a response's input items) refuses them alike.
package listquery

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// Limit returns the query's limit: def when absent, else an integer from 1 to max. The error is
// a client-visible 400.
func Limit(q url.Values, def, max int) (int, error) {
	if !q.Has("limit") {
		return def, nil
	}
	v := q.Get("limit")
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return 0, apierror.BadRequest(fmt.Sprintf("Invalid 'limit': expected an integer, but got '%s' instead.", v), "limit", apierror.CodeInvalidValue)
	case n < 1:
		return 0, apierror.BadRequest(fmt.Sprintf("Invalid 'limit': integer below minimum value. Expected a value >= 1, but got %d instead.", n), "limit", apierror.CodeIntegerBelowMinValue)
	case n > max:
		return 0, apierror.BadRequest(fmt.Sprintf("Invalid 'limit': integer above maximum value. Expected a value <= %d, but got %d instead.", max, n), "limit", apierror.CodeIntegerAboveMaxValue)
	}
	return n, nil
}

// Order returns the query's order: "desc" (newest first) when absent, else "asc" or "desc".
// The error is a client-visible 400.
func Order(q url.Values) (string, error) {
	if !q.Has("order") {
		return "desc", nil
	}
	switch v := q.Get("order"); v {
	case "asc", "desc":
		return v, nil
	default:
		return "", apierror.BadRequest(fmt.Sprintf("Invalid value for 'order': '%s'. Supported values are: 'asc' and 'desc'.", v), "order", apierror.CodeInvalidValue)
	}
}
