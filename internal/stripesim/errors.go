package stripesim

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned (wrapped) by control operations when the PaymentIntent, charge,
// event or customer they name does not exist. The control API maps it to 404.
var ErrNotFound = errors.New("stripesim: not found")

// ErrConflict is returned (wrapped) by control operations that are not allowed in the object's
// current state, such as settling a PaymentIntent that already succeeded. The control API maps
// it to 409.
var ErrConflict = errors.New("stripesim: conflict")

// ErrInvalid is returned (wrapped) by control operations given invalid input. The control API
// maps it to 400.
var ErrInvalid = errors.New("stripesim: invalid input")

func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
