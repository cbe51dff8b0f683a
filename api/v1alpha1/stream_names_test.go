package v1alpha1

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The ingestion tier's names derive from the Stream's: check they are valid
// for the longest Stream name the schema lets through.
func TestIngestNamesFit(t *testing.T) {
	stream := &Stream{ObjectMeta: metav1.ObjectMeta{Name: "s" + strings.Repeat("x", MaxStreamNameLength-1)}}
	for _, c := range []struct {
		what string
		name string
		errs []string
	}{
		{"ingestion Deployment", stream.IngestName(), validation.IsDNS1123Label(stream.IngestName())},
		{"ingestion Deployment as a label value", stream.IngestName(), validation.IsValidLabelValue(stream.IngestName())},
		{"ingestion Service", stream.IngestServiceName(), validation.IsDNS1035Label(stream.IngestServiceName())},
	} {
		if len(c.errs) > 0 {
			t.Errorf("%s %q (%d characters) is invalid: %v", c.what, c.name, len(c.name), c.errs)
		}
	}
}
