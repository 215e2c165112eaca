//! DNS answers for the guest, from the policy: names no rule allows get
//! NXDOMAIN at once (the question never leaves the host), allowed names get
//! their real A/AAAA records, internal addresses removed unless allowed.

use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::Shared;
use super::resolve::{self, Answer};
use crate::policy::{Host, is_host_alias};
use crate::protocol::audit::{Decision, Kind, Record as AuditRecord};
use crate::protocol::transparent::GATEWAY_IP;

/// Answers one DNS message (as carried over UDP). Garbage in gets FORMERR
/// when it has an id to answer to, and nothing otherwise.
pub async fn answer(shared: &Shared, query: &[u8]) -> Vec<u8> {
    let request = match Message::from_vec(query) {
        Ok(m) => m,
        Err(_) if query.len() >= 2 => {
            let id = u16::from_be_bytes([query[0], query[1]]);
            return encode(&Message::error_msg(id, OpCode::Query, ResponseCode::FormErr));
        }
        Err(_) => return Vec::new(),
    };
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true);
    let question = match (request.message_type(), request.op_code(), request.queries()) {
        (MessageType::Query, OpCode::Query, [question]) => question.clone(),
        (MessageType::Query, OpCode::Query, _) => return encode(response.set_response_code(ResponseCode::FormErr)),
        _ => return encode(response.set_response_code(ResponseCode::NotImp)),
    };
    response.add_query(question.clone());

    let ascii = question.name().to_ascii();
    let host = match Host::parse(&ascii) {
        Ok(host @ Host::Name(_)) => host,
        // Reverse lookups and odd names: nothing the policy can allow.
        _ => return encode(response.set_response_code(ResponseCode::NXDomain)),
    };
    if !shared.policy.allows_name(&host) {
        let mut record = AuditRecord::new(Kind::Dns, host.to_string(), 0, Decision::Deny);
        record.reason = Some("not in the policy".into());
        shared.audit.record(&record);
        return encode(response.set_response_code(ResponseCode::NXDomain));
    }
    let wanted = question.query_type();
    if wanted != RecordType::A && wanted != RecordType::AAAA {
        // Allowed, but only addresses are answered: no TXT and friends to
        // carry data out.
        return encode(&response);
    }
    let name = host.name().unwrap_or_default();
    let alias = is_host_alias(&host);
    let private_ok = alias || shared.policy.allow_private.iter().any(|r| r.rule.host.matches(&host));
    let answer = match shared.policy.pinned(name) {
        // The host's own services are reached at the gateway, which hands
        // every connection to this proxy.
        _ if alias => Answer::Addrs(vec![IpAddr::V4(GATEWAY_IP)], std::time::Duration::from_secs(60)),
        Some(ip) => Answer::Addrs(vec![ip], std::time::Duration::from_secs(60)),
        None => shared.resolver.records(name, wanted).await,
    };
    let (addrs, ttl) = match answer {
        Answer::Addrs(addrs, ttl) => (addrs, ttl),
        Answer::NxDomain => return encode(response.set_response_code(ResponseCode::NXDomain)),
        Answer::Failed(reason) => {
            tracing::debug!("DNS {name}: {reason}");
            return encode(response.set_response_code(ResponseCode::ServFail));
        }
    };
    let addrs = resolve::permitted(addrs, private_ok).unwrap_or_default();
    // Only answers of the asked type reach the guest; learning the others
    // would name addresses the guest was never given.
    let addrs: Vec<IpAddr> = addrs.into_iter().filter(|ip| ip.is_ipv4() == (wanted == RecordType::A)).collect();
    let ttl = u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX);
    let owner = Name::from_str(&format!("{name}.")).unwrap_or_else(|_| question.name().clone());
    for ip in addrs {
        shared.names.learn(ip, &host);
        let rdata = match (ip, wanted) {
            (IpAddr::V4(v4), RecordType::A) => RData::A(A(v4)),
            (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(v6)),
            _ => continue,
        };
        response.add_answer(Record::from_rdata(owner.clone(), ttl, rdata));
    }
    encode(&response)
}

fn encode(message: &Message) -> Vec<u8> {
    message.to_vec().unwrap_or_default()
}
