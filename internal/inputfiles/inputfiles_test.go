package inputfiles

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// pngData is enough of a PNG for its type to be recognised.
const pngData = "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"

func dataURL(typ, data string) string {
	return "data:" + typ + ";base64," + base64.StdEncoding.EncodeToString([]byte(data))
}

func TestImageURL(t *testing.T) {
	jpeg := "\xff\xd8\xff\xe0\x00\x10JFIF\x00"
	gif := "GIF89a\x01\x00\x01\x00"
	webp := "RIFF\x10\x00\x00\x00WEBPVP8 "
	big := pngData + strings.Repeat("x", 100_000) // more than the first read
	files := storetest.NewMemFiles()
	add := func(id, name, data string, size int64) { files.Add("k", id, name, data, size) }
	add("file-png", "a.png", pngData, int64(len(pngData)))
	add("file-big", "a.png", big, int64(len(big)))
	add("file-jpeg", "a.png", jpeg, int64(len(jpeg))) // the bytes decide, not the name
	add("file-gif", "a.gif", gif, int64(len(gif)))
	add("file-webp", "a.webp", webp, int64(len(webp)))
	add("file-svg", "a.svg", `<svg xmlns="http://www.w3.org/2000/svg"/>`, 40)
	add("file-bmp", "a.bmp", "BM\x00\x00\x00\x00\x00\x00", 8)
	add("file-empty", "a.png", "", 0)
	add("file-huge", "a.png", pngData, MaxImageBytes+1) // too large by its size
	add("file-lying", "a.png", pngData+"123", 3)        // a store whose size understates the bytes
	add("file-lyingbig", "a.png", big, 3)
	files.Add("other", "file-theirs", "a.png", pngData, int64(len(pngData)))
	tests := []struct {
		id       string
		left     int64
		wantType string // the data URL's type; "" for an error
		code     string
	}{
		{"file-png", MaxInputImageBytes, "image/png", ""},
		{"file-big", MaxInputImageBytes, "image/png", ""},
		{"file-jpeg", MaxInputImageBytes, "image/jpeg", ""},
		{"file-gif", MaxInputImageBytes, "image/gif", ""},
		{"file-webp", MaxInputImageBytes, "image/webp", ""},
		{"file-svg", MaxInputImageBytes, "", "unsupported_image_media_type"},
		{"file-bmp", MaxInputImageBytes, "", "unsupported_image_media_type"},
		{"file-empty", MaxInputImageBytes, "", "empty_image_file"},
		{"file-huge", MaxInputImageBytes, "", "image_file_too_large"},
		{"file-png", int64(len(pngData)) - 1, "", "image_file_too_large"}, // the request's images have less left
		{"file-lying", int64(len(pngData)), "", "image_file_too_large"},
		{"file-lyingbig", 1000, "", "image_file_too_large"},
		{"file-nope", MaxInputImageBytes, "", ""},
		{"file-theirs", MaxInputImageBytes, "", ""}, // another owner's: as if it did not exist
	}
	const param = "input[0].content[0].file_id"
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.id, tt.left), func(t *testing.T) {
			url, n, err := ImageURL(context.Background(), files, "k", tt.id, param, tt.left)
			if tt.wantType != "" {
				want := dataURL(tt.wantType, files.Data(tt.id))
				if err != nil || url != want || n != int64(len(files.Data(tt.id))) {
					t.Fatalf("ImageURL = %.80q, %d, %v; want %.80q", url, n, err, want)
				}
				return
			}
			var ae *apierror.Error
			if !errors.As(err, &ae) {
				t.Fatalf("ImageURL = %q, %v; want an API error", url, err)
			}
			wantStatus := 400
			if tt.code == "" {
				wantStatus = 404
			}
			if ae.Status != wantStatus || ae.Code != tt.code || ae.Param != param {
				t.Errorf("error %d %q %q (%s); want %d %q naming %s", ae.Status, ae.Code, ae.Param, ae.Message, wantStatus, tt.code, param)
			}
		})
	}
}

func TestFileType(t *testing.T) {
	tests := []struct{ name, head, want string }{
		{"report.pdf", "%PDF-1.7\n", "application/pdf"},
		{"report.bin", "%PDF-1.7\n", "application/pdf"}, // the bytes say
		{"photo.dat", pngData, "image/png"},
		{"notes.txt", "hello", "text/plain"},
		{"data.json", `{"a":1}`, "application/json"}, // text: the name says more
		{"page.html", "plain words", "text/html"},
		{"blob", "\x00\x01\x02", "application/octet-stream"},
		{"noext", "hello", "text/plain"},
		{"", "", "text/plain"},
	}
	for _, tt := range tests {
		if got := fileType(tt.name, []byte(tt.head)); got != tt.want {
			t.Errorf("fileType(%q, %q) = %q; want %q", tt.name, tt.head, got, tt.want)
		}
	}
}
