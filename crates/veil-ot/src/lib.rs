//! Oblivious transfer: base OT, IKNP, silent COT and the derived flavours protocols consume.
