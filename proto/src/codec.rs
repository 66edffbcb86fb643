//! The gRPC codec of every Kairos service: prost's, except that a message that does not
//! decode (malformed protobuf, invalid UTF-8 in a string field) is the sender's mistake —
//! `INVALID_ARGUMENT` naming what failed — not an `INTERNAL` error of the receiver.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// prost encoding; decoding errors are `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct KairosCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for KairosCodec<T, U> {
    fn default() -> Self {
        KairosCodec(PhantomData)
    }
}

impl<T, U> Codec for KairosCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = KairosDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        KairosDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// prost's decoder with its errors as `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct KairosDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for KairosDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            Status::invalid_argument(format!("the message does not decode: {}", s.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
