//! Disbatch 4.103's own Perl DEN and CLI (the shared peer `disbatch4-perl`), run beside ours.

pub mod perl_cli;
pub mod perl_den;
