package sandbox

import (
	"encoding/json"
	"fmt"
)

// Message types of the /execute stream.
const (
	MessageStdout             = "stdout"
	MessageStderr             = "stderr"
	MessageResult             = "result"
	MessageError              = "error"
	MessageNumberOfExecutions = "number_of_executions"
	MessageKeepalive          = "keepalive"
	MessageEndOfExecution     = "end_of_execution"
)

// wireMessage is the flat shape of every message type, as the server writes it.
type wireMessage struct {
	Type           string          `json:"type"`
	Text           string          `json:"text"`
	Timestamp      string          `json:"timestamp"`
	ExecutionCount int             `json:"execution_count"`
	HTML           string          `json:"html"`
	Markdown       string          `json:"markdown"`
	SVG            string          `json:"svg"`
	PNG            string          `json:"png"`
	JPEG           string          `json:"jpeg"`
	PDF            string          `json:"pdf"`
	LaTeX          string          `json:"latex"`
	JSON           json.RawMessage `json:"json"`
	JavaScript     string          `json:"javascript"`
	Data           json.RawMessage `json:"data"`
	Chart          json.RawMessage `json:"chart"`
	Extra          json.RawMessage `json:"extra"`
	IsMainResult   bool            `json:"is_main_result"`
	Name           string          `json:"name"`
	Value          string          `json:"value"`
	Traceback      string          `json:"traceback"`
}

// message converts the flat wire shape into a Message, routing "text" by type.
func (w *wireMessage) message() Message {
	m := Message{Type: w.Type}
	switch w.Type {
	case MessageStdout, MessageStderr:
		m.Text, m.Timestamp = w.Text, w.Timestamp
	case MessageResult:
		m.Output = Output{
			Text: w.Text, HTML: w.HTML, Markdown: w.Markdown, SVG: w.SVG, PNG: w.PNG, JPEG: w.JPEG,
			PDF: w.PDF, LaTeX: w.LaTeX, JSON: w.JSON, JavaScript: w.JavaScript, Data: w.Data,
			Chart: w.Chart, Extra: w.Extra, IsMainResult: w.IsMainResult,
		}
	case MessageError:
		m.ExecError = ExecError{Name: w.Name, Value: w.Value, Traceback: w.Traceback}
	case MessageNumberOfExecutions:
		m.ExecutionCount = w.ExecutionCount
	}
	return m
}

// UnmarshalJSON reads one wire message; see Message for where each field lands.
func (m *Message) UnmarshalJSON(b []byte) error {
	var w wireMessage
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*m = w.message()
	return nil
}

// MarshalJSON writes the message in the shape e2b's code-interpreter server sends for its type.
func (m Message) MarshalJSON() ([]byte, error) {
	switch m.Type {
	case MessageStdout, MessageStderr:
		return json.Marshal(struct {
			Type      string `json:"type"`
			Text      string `json:"text"`
			Timestamp string `json:"timestamp,omitempty"`
		}{m.Type, m.Text, m.Timestamp})
	case MessageResult:
		o := m.Output
		extra := o.Extra
		if len(extra) == 0 {
			extra = json.RawMessage("{}")
		}
		return json.Marshal(struct {
			Type         string          `json:"type"`
			Text         string          `json:"text,omitempty"`
			HTML         string          `json:"html,omitempty"`
			Markdown     string          `json:"markdown,omitempty"`
			SVG          string          `json:"svg,omitempty"`
			PNG          string          `json:"png,omitempty"`
			JPEG         string          `json:"jpeg,omitempty"`
			PDF          string          `json:"pdf,omitempty"`
			LaTeX        string          `json:"latex,omitempty"`
			JSON         json.RawMessage `json:"json,omitempty"`
			JavaScript   string          `json:"javascript,omitempty"`
			Data         json.RawMessage `json:"data,omitempty"`
			Chart        json.RawMessage `json:"chart,omitempty"`
			Extra        json.RawMessage `json:"extra"`
			IsMainResult bool            `json:"is_main_result"`
		}{m.Type, o.Text, o.HTML, o.Markdown, o.SVG, o.PNG, o.JPEG, o.PDF, o.LaTeX, o.JSON,
			o.JavaScript, o.Data, o.Chart, extra, o.IsMainResult})
	case MessageError:
		return json.Marshal(struct {
			Type      string `json:"type"`
			Name      string `json:"name"`
			Value     string `json:"value"`
			Traceback string `json:"traceback"`
		}{m.Type, m.Name, m.Value, m.Traceback})
	case MessageNumberOfExecutions:
		return json.Marshal(struct {
			Type           string `json:"type"`
			ExecutionCount int    `json:"execution_count"`
		}{m.Type, m.ExecutionCount})
	case "":
		return nil, fmt.Errorf("sandbox: message without a type")
	default:
		return json.Marshal(struct {
			Type string `json:"type"`
		}{m.Type})
	}
}

// payloadSize is what a result counts against the output limit.
func (o *Output) payloadSize() int {
	return len(o.Text) + len(o.HTML) + len(o.Markdown) + len(o.SVG) + len(o.PNG) + len(o.JPEG) +
		len(o.PDF) + len(o.LaTeX) + len(o.JSON) + len(o.JavaScript) + len(o.Data) + len(o.Chart) +
		len(o.Extra)
}
