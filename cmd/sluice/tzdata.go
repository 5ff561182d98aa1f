package main

// Rules may name an IANA time zone (a fixed window aligned to calendar
// units). The system's zoneinfo is used where there is one; this embedded
// copy (about 450 kB) answers where there is none, such as in the
// container image, which is built FROM scratch.
import _ "time/tzdata"
