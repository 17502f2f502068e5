#include "textflag.h"

// func Line(p unsafe.Pointer)
TEXT ·Line(SB), NOSPLIT, $0-8
	MOVD	p+0(FP), R0
	PRFM	(R0), PLDL1KEEP
	RET

// func Addrs(a []uintptr)
TEXT ·Addrs(SB), NOSPLIT, $0-24
	MOVD	a_base+0(FP), R1
	MOVD	a_len+8(FP), R2
	CBZ	R2, done
loop:
	MOVD.P	8(R1), R0
	PRFM	(R0), PLDL1KEEP
	SUB	$1, R2
	CBNZ	R2, loop
done:
	RET
